"""Which devices and dtypes `mpslaunch bench` may measure, and the per-device chores around timing.

Everything here is device-specific so the rest of the benchmark is not: detecting what is
present, refusing what cannot run (one-line MpslaunchError), synchronizing an asynchronous
device, freeing its cache between sizes, how much memory is free, and recognising an
out-of-memory error from any backend.

Imports torch: only `bench.main` imports this module, never the CLI parser.
"""

from __future__ import annotations

import gc
import os
import platform
import subprocess

import torch

from mpslaunch.errors import MpslaunchError

KNOWN_DEVICES = ("cpu", "mps", "cuda")

# Accepted spellings -> canonical dtype name; the canonical names are what tables and CSV show.
DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
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
    here is an error, never a silent fall back to cpu (DESIGN.md, "Device").
    """
    if cpu_only:
        return ["cpu"]
    if not requested:
        return ["cpu", *accelerators_present()]
    present = {"cpu", *accelerators_present()}
    for name in requested:
        if name not in KNOWN_DEVICES:
            raise MpslaunchError(
                f"Unknown device {name!r} in --devices; choose from {', '.join(KNOWN_DEVICES)}."
            )
        if name not in present:
            raise MpslaunchError(
                f"--devices asks for {name}, but this machine has no usable {name} device "
                f"(found: {', '.join(sorted(present))}); drop {name} from --devices."
            )
    return sorted(set(requested), key=KNOWN_DEVICES.index)


def canonical_dtype(name: str) -> str:
    try:
        return DTYPE_ALIASES[name.lower()]
    except KeyError:
        raise MpslaunchError(
            f"Unknown dtype {name!r} in --dtype; choose from float32, bfloat16, float16 "
            "(or fp32, bf16, fp16)."
        ) from None


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def check_dtype_supported(device: str, dtype: str) -> None:
    """Refuse a dtype the device cannot run, before any measurement starts.

    bf16 and fp16 on cpu are allowed: they run (slowly on CPUs without bf16/fp16 units) and
    comparing them is a fair question to ask.
    """
    # MPS-FACTS.md: bfloat16 on MPS needs macOS 14 or later.
    if device == "mps" and dtype == "bfloat16" and not _mps_is_macos_or_newer(14, 0):
        raise MpslaunchError(
            "bfloat16 on mps needs macOS 14 or later; drop bfloat16 from --dtype, "
            "or pass --devices cpu to measure it on the CPU only."
        )
    if device == "cuda" and dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        raise MpslaunchError(
            "This CUDA GPU does not support bfloat16; drop bfloat16 from --dtype."
        )


def _mps_is_macos_or_newer(major: int, minor: int) -> bool:
    probe = getattr(torch.backends.mps, "is_macos_or_newer", None)
    return bool(probe and probe(major, minor))


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
            # recommended_max_memory exists from torch 2.5 (MPS-FACTS.md, "Memory APIs").
            recommended = getattr(torch.mps, "recommended_max_memory", None)
            if recommended is None:
                return None
            return recommended() - torch.mps.driver_allocated_memory()
        return _cpu_free_bytes()
    except (RuntimeError, OSError, ValueError):
        return None


def _cpu_free_bytes() -> int | None:
    # MemAvailable counts reclaimable page cache; free pages alone would understate it.
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:  # macOS: no /proc; total physical memory is the best cheap bound.
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
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


def describe(device: str) -> str:
    """One line naming the hardware behind a device, for the table header and the JSON."""
    if device == "cuda":
        return torch.cuda.get_device_name()
    if device == "mps":
        return f"Apple GPU (macOS {platform.mac_ver()[0] or '?'})"
    return f"{_cpu_name()}, {torch.get_num_threads()} threads"


def _cpu_name() -> str:
    try:  # Linux
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":  # "Apple M2 Pro"
        try:
            done = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                  capture_output=True, text=True, timeout=5)
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return platform.processor() or platform.machine()
