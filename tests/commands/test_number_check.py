"""The numbers check on the CPU: float32 and bf16 training match the float64 reference within
their tolerances, and a tensor that differs is named, the first one in training order."""

from __future__ import annotations

import math

import pytest
import torch

from mpslaunch.commands.test import number_check
from mpslaunch.commands.test.number_check import TOLERANCE, compare, describe, judge

CPU = torch.device("cpu")


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_the_cpu_matches_its_own_float64(precision):
    result = compare(torch, CPU, precision)
    assert result.ok, describe(result)
    assert result.tensors == number_check.STEPS * 10  # output, loss, 4 gradients, 4 updates
    assert 0 < result.largest_error <= TOLERANCE[precision]
    assert describe(result).startswith(f"30 tensors of 3 training steps on cpu in "
                                       f"{result.dtype} match the CPU's float64 within ")


def reference_trace():
    torch.manual_seed(0)
    net = number_check.model(torch).double()
    inputs, labels = number_check.batch(torch)
    return number_check.trace(torch, net, inputs, labels, CPU, "no")


def test_the_first_tensor_beyond_the_tolerance_is_named():
    reference = reference_trace()
    measured = [(name, tensor.clone()) for name, tensor in reference]
    names = [name for name, _ in reference]
    for late in ("step 3 loss", "step 2 gradient of 2.bias"):
        measured[names.index(late)][1].mul_(1.5)
    measured[names.index("step 2 output")][1].view(-1)[5] *= 1.2  # one element of 64, 20% off
    result = judge(torch, "cpu", "no", reference, measured)
    assert not result.ok
    assert result.first_mismatch == "step 2 output"
    assert describe(result).startswith("step 2 output on cpu in float32 differs from the CPU's "
                                       "float64 by ")


def test_a_nan_or_a_wrong_shape_is_a_mismatch():
    reference = reference_trace()
    nan = [(name, tensor.clone()) for name, tensor in reference]
    nan[0][1].view(-1)[0] = math.nan
    assert judge(torch, "cpu", "no", reference, nan).first_mismatch == "step 1 output"
    shaped = list(reference)
    name, tensor = shaped[3]
    shaped[3] = (name, tensor.reshape(-1)[:-1])
    assert judge(torch, "cpu", "no", reference, shaped).first_mismatch == name


def test_within_tolerance_passes_and_reports_the_largest_error():
    reference = reference_trace()
    measured = [(name, tensor * (1 + 5e-5)) for name, tensor in reference]  # under float32's 1e-4
    result = judge(torch, "cpu", "no", reference, measured)
    assert result.ok and result.largest_error == pytest.approx(5e-5, rel=1e-3)
    assert set(result.figures()) >= {"device", "dtype", "tolerance", "tensors", "largest_error",
                                     "largest_at", "first_mismatch"}


def test_tf32_matrix_products_where_allowed_on_cuda_get_their_own_tolerance():
    allowed = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert number_check._computed_in(torch, torch.device("cuda"), "no") == "tf32"
        assert number_check._computed_in(torch, torch.device("cuda"), "bf16") == "bf16"
        assert number_check._computed_in(torch, CPU, "no") == "no"
        torch.backends.cuda.matmul.allow_tf32 = False
        assert number_check._computed_in(torch, torch.device("cuda"), "no") == "no"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed
    reference = reference_trace()
    measured = [(name, tensor * (1 + 5e-4)) for name, tensor in reference]  # TF32's rounding
    assert judge(torch, "cuda:0", "tf32", reference, measured).ok
    assert not judge(torch, "cuda:0", "no", reference, measured).ok
