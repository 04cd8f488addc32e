"""Which devices and dtypes `mpslaunch bench` may measure, and the per-device chores around
timing: synchronizing, freeing the cache between sizes, free memory, recognising out of memory.

Imports torch: only the bench command's run imports this module, never the CLI parser.
"""

from __future__ import annotations

import gc

import torch

from mpslaunch.machine import Machine, available_memory, cpu_brand
from mpslaunch.output import MpslaunchError
from mpslaunch.plan import precision_refusal

KNOWN_DEVICES = ("cpu", "mps", "cuda")

# Accepted spellings -> canonical dtype name; the canonical names are what tables and CSV show.
DTYPE_ALIASES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def accelerators_present() -> list[str]:
    """The accelerators this process can use now, in the launcher's preference order."""
    present = []
    if _mps_available():
        present.append("mps")
    if torch.cuda.is_available():
        present.append("cuda")
    return present


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def choose_devices(requested: list[str] | None, cpu_only: bool) -> list[str]:
    """cpu first (the baseline every speedup is measured against), then the accelerators.

    `--cpu` wins over everything, as in `mpslaunch launch`. Asking for a device that is not
    here is an error, never a silent fall back to cpu (docs/design.md: Device).
    """
    if cpu_only:
        return ["cpu"]
    if not requested:
        return ["cpu", *accelerators_present()]
    present = {"cpu", *accelerators_present()}
    for name in requested:
        if name not in KNOWN_DEVICES:
            raise MpslaunchError(
                f"unknown device {name!r} in --devices; choose from {', '.join(KNOWN_DEVICES)}"
            )
        if name not in present:
            raise MpslaunchError(
                f"--devices asks for {name}, but this machine has no usable {name} device "
                f"(found: {', '.join(sorted(present))}); drop {name} from --devices"
            )
    return sorted(set(requested), key=KNOWN_DEVICES.index)


def canonical_dtype(name: str) -> str:
    try:
        return DTYPE_ALIASES[name.lower()]
    except KeyError:
        raise MpslaunchError(
            f"unknown dtype {name!r} in --dtype; choose from float32, bfloat16, float16 "
            "(or fp32, bf16, fp16)"
        ) from None


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def check_dtype_supported(device: str, dtype: str, machine: Machine) -> None:
    """Refuse a dtype the device cannot run, before any measurement starts.

    bf16 and fp16 on cpu are allowed: they run (slowly on CPUs without bf16/fp16 units) and
    comparing them is a fair question to ask.
    """
    refusal = precision_refusal("bf16", device, machine) if dtype == "bfloat16" else None
    if device == "mps" and refusal:
        reason, _ = refusal  # its advice names launch's flags
        raise MpslaunchError(
            f"{reason}; drop bfloat16 from --dtype, or pass --devices cpu to "
            "measure it on the cpu only"
        )
    if device == "cuda" and dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        raise MpslaunchError("this CUDA GPU does not support bfloat16; drop bfloat16 from --dtype")


def synchronize(device: str) -> None:
    """Wait for queued work: cuda and mps return from an op before the GPU has run it."""
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def free_memory(device: str) -> None:
    """Return cached blocks so the next (larger) size starts from an empty device."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    elif device == "mps":
        torch.mps.empty_cache()


def free_bytes(device: str) -> int | None:
    """Memory the next allocation can use, or None when the backend cannot say."""
    try:
        if device == "cuda":
            return torch.cuda.mem_get_info()[0]
        if device == "mps":
            # recommended_max_memory exists from torch 2.5 (docs/mps-facts.md: Training on a Mac).
            recommended = getattr(torch.mps, "recommended_max_memory", None)
            if recommended is None:
                return None
            return recommended() - torch.mps.driver_allocated_memory()
        return available_memory()
    except (RuntimeError, OSError, ValueError):
        return None


def is_out_of_memory(error: BaseException) -> bool:
    """True for cuda, mps and cpu allocation failures, whatever their exception class."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(
        torch.cuda, "OutOfMemoryError", None
    )
    if oom_type is not None and isinstance(error, oom_type):
        return True
    if isinstance(error, MemoryError):
        return True
    # MPS: "MPS backend out of memory"; cpu: "DefaultCPUAllocator: can't allocate memory".
    text = str(error).lower()
    return isinstance(error, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def describe(device: str, machine: Machine) -> str:
    """One line naming the hardware behind a device, for the table header and the JSON."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    if device == "mps":
        return f"{machine.chip or 'Apple'} GPU (macOS {machine.macos_text or '?'})"
    return f"{cpu_brand() or machine.arch}, {torch.get_num_threads()} threads"
