"""Each known fault warns in the conditions its sources name, and nowhere else."""

from __future__ import annotations

import pytest

from mpslaunch.plan.known_faults import FAULTS, warnings_for

MACOS = (15, 5)


def names(torch="2.14.1", chip="Apple M4 Max", precision="no", device="mps", accelerate="1.15.0"):
    met = warnings_for(torch, chip, MACOS, precision, device, accelerate)
    return {fault.name for fault in FAULTS
            if any(line == fault.warning.format(torch=torch, accelerate=accelerate) for line in met)}


def test_every_row_names_its_sources_and_what_to_change():
    assert len({fault.name for fault in FAULTS}) == len(FAULTS)
    for fault in FAULTS:
        assert fault.sources
        assert "#" in fault.warning  # the issue or pull request, to read more
        assert "upgrade" in fault.warning or "keep" in fault.warning


def test_a_current_setup_meets_none():
    assert names() == set()
    assert names(precision="fp16") == set() and names(precision="bf16") == set()


@pytest.mark.parametrize("torch", ["2.8.0", "2.10.1", "2.12.1"])
def test_fp16_grad_scaler_fault_from_28_until_213(torch):
    assert names(torch=torch, precision="fp16") == {"mps-fp16-grad-scaler"}


@pytest.mark.parametrize("torch, precision, device", [
    ("2.13.0", "fp16", "mps"),   # fixed
    ("2.7.1", "fp16", "mps"),    # no GradScaler on mps yet (the plan refuses fp16 there)
    ("2.12.1", "bf16", "mps"),   # no GradScaler with bf16
    ("2.12.1", "no", "mps"),
    ("2.12.1", "fp16", "cuda"),
])
def test_fp16_grad_scaler_fault_not_elsewhere(torch, precision, device):
    assert "mps-fp16-grad-scaler" not in names(torch=torch, precision=precision, device=device)


@pytest.mark.parametrize("chip", ["Apple M1", "Apple M1 Pro", "Apple M2 Max", "Apple M2 Ultra"])
@pytest.mark.parametrize("torch", ["2.7.0", "2.13.0"])
def test_large_k_matmul_on_m1_and_m2_before_214(chip, torch):
    assert names(torch=torch, chip=chip) == {"m1-m2-large-k-matmul"}


@pytest.mark.parametrize("chip", ["Apple M1", "Apple M2 Pro"])
def test_batched_large_k_matmul_on_m1_and_m2_from_214(chip):
    assert names(torch="2.14.1", chip=chip) == {"m1-m2-large-k-bmm"}
    assert names(torch="2.15.0", chip=chip) == {"m1-m2-large-k-bmm"}  # not fixed yet


@pytest.mark.parametrize("chip, torch, device", [
    ("Apple M3 Pro", "2.13.0", "mps"),
    ("Apple M4", "2.10.0", "mps"),
    ("Apple M12", "2.13.0", "mps"),  # a name that only starts like M1
    (None, "2.13.0", "mps"),
    ("Apple M1", "2.13.0", "cpu"),
    ("Apple M2", "2.6.0", "mps"),  # before the releases the reports name
])
def test_large_k_matmul_not_elsewhere(chip, torch, device):
    assert not names(torch=torch, chip=chip, device=device) & {"m1-m2-large-k-matmul",
                                                               "m1-m2-large-k-bmm"}


@pytest.mark.parametrize("accelerate", ["1.0.0", "1.10.1"])
def test_accelerate_before_111_and_mixed_precision_on_mps(accelerate):
    assert names(accelerate=accelerate, precision="fp16") == {"accelerate-mps-fp16"}
    assert names(accelerate=accelerate, precision="bf16") == {"accelerate-mps-bf16"}


@pytest.mark.parametrize("accelerate, precision, device", [
    ("1.11.0", "fp16", "mps"),
    ("1.10.1", "no", "mps"),
    ("1.10.1", "bf16", "cpu"),
    ("1.10.1", "fp16", "cuda"),
    (None, "bf16", "mps"),  # no Accelerate installed: nothing of its own to warn about
])
def test_accelerate_fault_not_elsewhere(accelerate, precision, device):
    assert not names(accelerate=accelerate, precision=precision, device=device) & {
        "accelerate-mps-fp16", "accelerate-mps-bf16"}


def test_no_torch_no_torch_faults():
    assert names(torch=None, chip="Apple M1", precision="fp16") == set()


def test_the_line_names_the_versions_in_use():
    (line,) = warnings_for("2.12.0+cpu", "Apple M3", MACOS, "fp16", "mps", "1.15.0")
    assert line.startswith("fp16 on mps with torch 2.12.0+cpu: ")
    assert "upgrade torch to 2.13 or later" in line
