"""What this computer is: platform facts probed with the standard library only.

The launcher does not import torch on the one-process path (the child imports it anyway), so
facts come from os.uname, sysctl on macOS, /proc and /dev on Linux, and torch's version.py read
as text. Tests build `Machine` values by hand to describe computers we do not own.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Machine:
    system: str  # platform.system(): "Darwin", "Linux", "Windows"
    arch: str  # platform.machine() of this Python: "arm64", "x86_64", "aarch64"
    macos_version: tuple[int, ...] | None = None
    rosetta: bool = False  # an x86_64 Python translated on an Apple silicon Mac
    chip: str | None = None  # "Apple M2 Pro", "NVIDIA H200", a CPU brand
    torch_version: str | None = None  # installed torch, e.g. "2.14.1"; None if absent
    torch_cuda: str | None = None  # CUDA version torch was built with; None for CPU/MPS builds
    cuda_devices: tuple[str, ...] = ()  # names of the NVIDIA GPUs this process may use
    cpu_count: int = 1
    python: str = sys.executable

    @property
    def is_mac(self) -> bool:
        return self.system == "Darwin"

    @property
    def macos_text(self) -> str:
        return ".".join(map(str, self.macos_version or ()))


def probe() -> Machine:
    """The Machine this process runs on. Cheap: a few file reads, sysctl only on macOS."""
    system, arch = os.uname().sysname, os.uname().machine  # platform.* costs an import
    is_mac = system == "Darwin"
    torch_facts = _torch_build_facts()
    return Machine(
        system=system,
        arch=arch,
        macos_version=_macos_version() if is_mac else None,
        rosetta=is_mac and _sysctl("sysctl.proc_translated") == "1",
        chip=cpu_brand() if is_mac else None,
        torch_version=torch_facts.get("__version__"),
        torch_cuda=torch_facts.get("cuda"),
        cuda_devices=() if is_mac else visible_nvidia_gpus(),
        cpu_count=os.cpu_count() or 1,
        python=sys.executable,
    )


def loopback_interface(platform: str = sys.platform) -> str:
    """The loopback network interface's name, as GLOO_SOCKET_IFNAME wants it."""
    return "lo0" if platform == "darwin" else "lo"


def version_tuple(text: str | None) -> tuple[int, ...]:
    """'2.14.1+cu130' -> (2, 14, 1); leading numeric parts only."""
    numbers = re.match(r"[\d.]*", text or "").group(0)
    return tuple(int(part) for part in numbers.split(".") if part)


def cpu_brand() -> str | None:
    """The processor's name: "Apple M2 Pro" on a Mac, /proc/cpuinfo's model name on Linux."""
    if os.uname().sysname == "Darwin":
        return _sysctl("machdep.cpu.brand_string")
    return _proc_field("/proc/cpuinfo", "model name")


def available_memory() -> int | None:
    """Bytes a new allocation can use: MemAvailable on Linux (it counts reclaimable page cache),
    the physical memory elsewhere; None when unknown."""
    kib = _proc_field("/proc/meminfo", "MemAvailable")
    if kib:
        return int(kib.split()[0]) * 1024
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _proc_field(path: str, name: str) -> str | None:
    """The value of `name: value` in a /proc text file, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


def _macos_version() -> tuple[int, ...] | None:
    import platform

    return version_tuple(platform.mac_ver()[0]) or None


def _sysctl(name: str) -> str | None:
    try:
        done = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _torch_build_facts() -> dict[str, str]:
    """`__version__` and `cuda` from torch/version.py, read as text: importing torch costs seconds
    (and importlib.metadata, an import of its own on every launch)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {}
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = version_file.read_text()
    except OSError:
        return {}
    found = re.findall(r"^(__version__|cuda)\b[^=]*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return {name: value.split("+")[0] if name == "__version__" else value for name, value in found}


def visible_nvidia_gpus() -> tuple[str, ...]:
    """Names of the NVIDIA GPUs the driver exposes, narrowed by CUDA_VISIBLE_DEVICES."""
    names = _nvidia_gpu_names()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return names
    return names[: _count_visible(visible, len(names))]


def _count_visible(setting: str, present: int) -> int:
    # CUDA stops at the first invalid entry; "" and "-1" hide every GPU.
    count = 0
    for entry in setting.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return min(count, present)


def _nvidia_gpu_names() -> tuple[str, ...]:
    proc_dir = Path("/proc/driver/nvidia/gpus")
    if proc_dir.is_dir():
        return tuple(_gpu_model(info / "information") for info in sorted(proc_dir.iterdir()))
    # Containers often expose only the device nodes /dev/nvidia0, /dev/nvidia1, ...
    nodes = [p for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)]
    return tuple("NVIDIA GPU" for _ in nodes)


def _gpu_model(information: Path) -> str:
    try:
        found = re.search(r"^Model:\s*(.+)$", information.read_text(), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1).strip() if found else "NVIDIA GPU"
