"""What this computer is: platform facts probed with the standard library only.

The launcher does not import torch on the single-process path (it costs ~2 s and ~600 MB and
the child imports it anyway), so every fact here comes from the platform module, sysctl on
macOS, files under /proc and /dev on Linux, and torch's installed metadata read as text.
Tests build `Machine` values by hand to describe computers we do not own.
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
    # Probed only for machine 0 of several (with_addresses): psutil costs an import on every launch.
    addresses: tuple[str, ...] | None = None  # this machine's interface addresses; None: not probed
    name_lookup: tuple[str, tuple[str, ...]] | None = None  # a host name and what it resolved to

    @property
    def is_mac(self) -> bool:
        return self.system == "Darwin"

    @property
    def is_apple_silicon(self) -> bool:
        return self.is_mac and (self.arch == "arm64" or self.rosetta)

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
        chip=_sysctl("machdep.cpu.brand_string") if is_mac else None,
        torch_version=torch_facts.get("__version__"),
        torch_cuda=torch_facts.get("cuda"),
        cuda_devices=() if is_mac else visible_nvidia_gpus(),
        cpu_count=os.cpu_count() or 1,
        python=sys.executable,
    )


def version_tuple(text: str | None) -> tuple[int, ...]:
    """'2.14.1+cu130' -> (2, 14, 1); leading numeric parts only."""
    numbers = re.match(r"[\d.]*", text or "").group(0)
    return tuple(int(part) for part in numbers.split(".") if part)


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
    """`__version__` and `cuda` from torch/version.py, read as text: importing torch costs seconds.

    (importlib.metadata would also do for the version, but costs ~20 ms on every launch.)
    """
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


# ---------------------------------------------------------------- network addresses


def with_addresses(machine: Machine, main_address: str) -> Machine:
    """`machine` with its interface addresses (unless already known) and, when `main_address`
    is a host name, what it resolves to. Nothing is sent anywhere: the interfaces are listed,
    and a name is looked up as the system resolves it."""
    import dataclasses

    known = machine.addresses if machine.addresses is not None else interface_addresses()
    lookup = None if plain_address(main_address) else (main_address, resolved_addresses(main_address))
    return dataclasses.replace(machine, addresses=known, name_lookup=lookup)


def interface_addresses() -> tuple[str, ...]:
    """Every IPv4 and IPv6 address of this machine's network interfaces (loopback included)."""
    import socket

    import psutil  # here only: a several-machine launch is the one that needs it

    found = {plain_address(entry.address) for entries in psutil.net_if_addrs().values()
             for entry in entries if entry.family in (socket.AF_INET, socket.AF_INET6)}
    return tuple(sorted(found - {None}))


def resolved_addresses(name: str) -> tuple[str, ...]:
    """The addresses a host name stands for; () when it resolves to nothing."""
    import socket

    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return ()
    return tuple(sorted({plain_address(entry[4][0]) for entry in found} - {None}))


def plain_address(text: str) -> str | None:
    """An IP address in one spelling (IPv6 compressed, without its zone: fe80::1%eth0), or None
    when `text` is not an address (a host name)."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(text.split("%", 1)[0]))
    except ValueError:
        return None
