"""Does the device compute the CPU's numbers? A small fixed model trains a few steps twice from
the same weights and data: on the planned device in float32 (or under the planned mixed
precision), and on the CPU in float64 as the reference. Every tensor along the way (the output,
the loss, each gradient, each step's update) must match within the tolerance of the dtype that
computed it; otherwise the first one that does not is named.

Used by the check script (selfcheck.py) in every rank: standard library and torch only. Its
first layer sums over 32,768 inputs, the size past which matrix products on M1 and M2 GPUs have
been reported wrong (docs/mps-facts.md: Known faults).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

STEPS = 3
WIDE = 2**15  # the first layer's inputs: its matrix product sums over this many terms
BATCH = 16
LEARNING_RATE = 1.0  # large enough that each step moves every weight by a visible amount
# The largest error allowed, relative to the reference tensor's largest magnitude: float32 keeps
# about 7 digits, float16 and TF32 (float32 matrix products on tensor cores, where the user
# allowed them) about 3, bfloat16 about 2; mixed precision rounds each product.
TOLERANCE = {"no": 1e-4, "tf32": 1e-2, "fp16": 1e-2, "bf16": 5e-2}
DTYPE_NAME = {
    "no": "float32",
    "tf32": "float32 with TF32 matrix products",
    "fp16": "float16",
    "bf16": "bfloat16",
}


@dataclass(frozen=True)
class Comparison:
    """The figures of one run of the check (what --json carries)."""

    device: str
    dtype: str  # what the device computed in
    tolerance: float
    tensors: int  # how many tensors were compared
    largest_error: float  # the largest relative error seen among the tensors that matched
    largest_at: str  # which tensor it was
    first_mismatch: str | None = None  # the first tensor beyond the tolerance
    mismatch_error: float | None = None

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None

    def figures(self) -> dict:
        return asdict(self)


def model(torch):
    return torch.nn.Sequential(torch.nn.Linear(WIDE, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(torch):
    generator = torch.Generator().manual_seed(1)
    # Rows of about unit length: the wide layer's outputs and steps stay moderate.
    inputs = torch.randn(BATCH, WIDE, generator=generator, dtype=torch.float64) / WIDE**0.5
    labels = torch.randint(0, 4, (BATCH,), generator=generator)
    return inputs, labels


def trace(torch, net, inputs, labels, device, precision: str) -> list[tuple[str, object]]:
    """(name, tensor on the CPU in float64) for every tensor of STEPS steps of plain SGD."""
    optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
    mixed = precision != "no"
    scaler = grad_scaler(torch, device.type) if precision == "fp16" else None
    recorded = []

    def keep(name, tensor):
        recorded.append((name, tensor.detach().to("cpu", torch.float64)))

    for step in range(1, STEPS + 1):
        optimizer.zero_grad()
        with torch.autocast(device_type=device.type, dtype=_dtype(torch, precision), enabled=mixed):
            output = net(inputs)
            loss = torch.nn.functional.cross_entropy(output, labels)
        keep(f"step {step} output", output)
        keep(f"step {step} loss", loss)
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)
        for name, parameter in net.named_parameters():
            keep(f"step {step} gradient of {name}", parameter.grad)
        before = [parameter.detach().clone() for parameter in net.parameters()]
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        for (name, parameter), old in zip(net.named_parameters(), before, strict=True):
            keep(f"step {step} update of {name}", parameter.detach() - old)
    return recorded


def compare(torch, device, precision: str) -> Comparison:
    """Train on `device` under `precision` and on the CPU in float64; compare every tensor."""
    torch.manual_seed(0)
    reference_net = model(torch).double()
    device_net = copy.deepcopy(reference_net).to(device=device, dtype=torch.float32)
    inputs, labels = batch(torch)
    reference = trace(torch, reference_net, inputs, labels, torch.device("cpu"), "no")
    measured = trace(
        torch, device_net, inputs.to(device, torch.float32), labels.to(device), device, precision
    )
    return judge(torch, str(device), _computed_in(torch, device, precision), reference, measured)


def _computed_in(torch, device, precision: str) -> str:
    """What sets the tolerance: the mixed precision, else TF32 where this process allows it on
    cuda (torch.backends.cuda.matmul.allow_tf32, TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1)."""
    if precision == "no" and device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return precision


def judge(torch, device: str, precision: str, reference, measured) -> Comparison:
    tolerance = TOLERANCE[precision]
    largest, largest_at = 0.0, ""
    for (name, expected), (_, got) in zip(reference, measured, strict=True):
        error = relative_error(torch, got, expected)
        if not error <= tolerance:  # a NaN is a mismatch too
            return Comparison(
                device,
                DTYPE_NAME[precision],
                tolerance,
                len(reference),
                largest,
                largest_at,
                first_mismatch=name,
                mismatch_error=error,
            )
        if error >= largest:
            largest, largest_at = error, name
    return Comparison(device, DTYPE_NAME[precision], tolerance, len(reference), largest, largest_at)


def relative_error(torch, got, expected) -> float:
    """The largest difference, relative to the reference's largest magnitude."""
    if got.shape != expected.shape:
        return float("inf")
    scale = expected.abs().max().item() if expected.numel() else 0.0
    difference = (got - expected).abs().max().item() if expected.numel() else 0.0
    return difference / scale if scale > 0 else difference


def describe(result: Comparison) -> str:
    where = f"on {result.device} in {result.dtype}"
    if result.ok:
        return (
            f"{result.tensors} tensors of {STEPS} training steps {where} match the CPU's "
            f"float64 within {result.tolerance:g} (largest error {result.largest_error:.1e}, "
            f"{result.largest_at})"
        )
    return (
        f"{result.first_mismatch} {where} differs from the CPU's float64 by "
        f"{result.mismatch_error:.3g} of its scale, above the {result.tolerance:g} allowed "
        f"for {result.dtype}"
    )


def _dtype(torch, precision: str):
    return {"no": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]


def grad_scaler(torch, device_type: str):
    amp_scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if amp_scaler is not None:
        return amp_scaler(device_type)
    return torch.cuda.amp.GradScaler()  # torch < 2.3
