"""Published faults of torch and Accelerate on mps that a plan can meet, and the one-line
warning for each: pure data and one pure function of what the plan knows before the script
starts (torch's and Accelerate's versions, the chip, macOS, the precision, the device).

Each row rests on a fault confirmed in PyTorch's tracker and release notes or in Accelerate's
source, with the versions and chips named there (docs/mps-facts.md: Known faults); none is
guessed. A row says what the fault does and what to change.
"""

from __future__ import annotations

import re

from mpslaunch import Record, record
from mpslaunch.machine import version_tuple

ANY_PRECISION = frozenset({"no", "fp16", "bf16"})


@record
class KnownFault(Record):
    name: str
    warning: str  # {torch} and {accelerate} stand for the versions in use
    sources: tuple[str, ...]
    device: str = "mps"
    precisions: frozenset[str] = ANY_PRECISION
    torch_from: tuple[int, ...] | None = None  # the first torch release with the fault
    torch_fixed: tuple[int, ...] | None = None  # the first without it; None: not fixed
    chip: str | None = None  # a pattern the chip's name matches; None: any chip
    accelerate_fixed: tuple[int, ...] | None = None  # the fault is Accelerate's, below this


# Apple7 and Apple8 GPUs: every M1 and M2 (Apple's Metal feature set tables).
M1_OR_M2 = r"Apple M[12]\b"

FAULTS = (
    KnownFault(
        name="mps-fp16-grad-scaler",
        warning=(
            "fp16 on mps with torch {torch}: GradScaler's unscale zeroes gradients held in "
            "fp16 or bf16, and fused optimizers (fused=True) ignore the grad scale and "
            "skipped steps (pytorch/pytorch#184286, #186360, fixed in torch 2.13); upgrade "
            "torch to 2.13 or later, or train in fp32 (--mixed_precision no)"
        ),
        sources=("pytorch/pytorch#184286", "pytorch/pytorch#186360", "torch 2.13.0 release notes"),
        precisions=frozenset({"fp16"}),
        torch_from=(2, 8),  # GradScaler on mps arrived in 2.8 (#150255)
        torch_fixed=(2, 13),
    ),
    KnownFault(
        name="m1-m2-large-k-matmul",
        warning=(
            "on an M1 or M2 GPU with torch {torch}, matrix products over a reduction "
            "dimension of 32,767 or more (a language model's output layer, say) can be "
            "silently wrong by 10-30% (pytorch/pytorch#193487, #177116, fixed for 2-D "
            "products in torch 2.14); upgrade torch to 2.14 or later"
        ),
        sources=(
            "pytorch/pytorch#193487",
            "pytorch/pytorch#177116",
            "pytorch/pytorch#183535",
            "torch 2.14.0 release notes",
        ),
        torch_from=(2, 7),
        torch_fixed=(2, 14),
        chip=M1_OR_M2,
    ),
    KnownFault(
        name="m1-m2-large-k-bmm",
        warning=(
            "on an M1 or M2 GPU, batched matrix products (bmm, 3-D matmul, einsum) over a "
            "reduction dimension of 32,767 or more can be silently wrong "
            "(pytorch/pytorch#195163, open); keep such products 2-D, or compare their "
            "results with the CPU's"
        ),
        sources=("pytorch/pytorch#195163",),
        torch_from=(2, 14),  # below 2.14 the row above covers every matrix product
        chip=M1_OR_M2,
    ),
    KnownFault(
        name="accelerate-mps-fp16",
        warning=(
            "fp16 on mps with Accelerate {accelerate}: an unmodified Accelerator() refuses "
            'it ("fp16 mixed precision requires a GPU"); Accelerate enables mixed '
            "precision on mps from 1.11 (huggingface/accelerate#3373); upgrade accelerate, "
            "or use --mixed_precision no"
        ),
        sources=("huggingface/accelerate#3373", "accelerate v1.10.1 and v1.11.0 source"),
        precisions=frozenset({"fp16"}),
        accelerate_fixed=(1, 11),
    ),
    KnownFault(
        name="accelerate-mps-bf16",
        warning=(
            "bf16 on mps with Accelerate {accelerate}: an unmodified Accelerator() "
            "silently trains in fp32; Accelerate enables mixed precision on mps from 1.11 "
            "(huggingface/accelerate#3373); upgrade accelerate, or use --mixed_precision no"
        ),
        sources=("huggingface/accelerate#3373", "accelerate v1.10.1 and v1.11.0 source"),
        precisions=frozenset({"bf16"}),
        accelerate_fixed=(1, 11),
    ),
)


def warnings_for(
    torch_version: str | None,
    chip: str | None,
    macos: tuple[int, ...] | None,
    precision: str,
    device: str,
    accelerate_version: str | None,
) -> tuple[str, ...]:
    """One warning line for each known fault these conditions meet. `macos` is accepted so
    that a row may name macOS releases; none of the verified rows depends on it."""
    del macos
    met = []
    for fault in FAULTS:
        if _meets(fault, torch_version, chip, precision, device, accelerate_version):
            met.append(fault.warning.format(torch=torch_version, accelerate=accelerate_version))
    return tuple(met)


def _meets(
    fault: KnownFault,
    torch_version: str | None,
    chip: str | None,
    precision: str,
    device: str,
    accelerate_version: str | None,
) -> bool:
    if device != fault.device or precision not in fault.precisions:
        return False
    if fault.chip is not None and not (chip and re.match(fault.chip, chip)):
        return False
    if fault.accelerate_fixed is not None:
        return (
            accelerate_version is not None
            and version_tuple(accelerate_version) < fault.accelerate_fixed
        )
    if torch_version is None:
        return False
    release = version_tuple(torch_version)
    return (fault.torch_from is None or release >= fault.torch_from) and (
        fault.torch_fixed is None or release < fault.torch_fixed
    )
