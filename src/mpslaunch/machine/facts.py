"""What this computer is: platform facts probed with the standard library only.

The launcher does not import torch on the one-process path (the child imports it anyway), so
facts come from os.uname, one sysctl call on macOS (and pmset for the power source), /proc and
/dev on Linux, and torch's and Accelerate's versions read as text; what torch itself says about
mps on a Mac comes from a child Python, cached (torch_check.py). Tests build `Machine` values by
hand to describe computers we do not own.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from itertools import takewhile

from mpslaunch import Record, record

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on every launch
if TYPE_CHECKING:
    from mpslaunch.machine.torch_check import MpsAnswer

# One `sysctl` call reads them all; the last two are missing on some older macOS releases.
_MAC_SYSCTLS = (
    "kern.osproductversion",
    "kern.osversion",
    "machdep.cpu.brand_string",
    "kern.hv_vmm_present",
    "sysctl.proc_translated",
)


@record
class Machine(Record):
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
    virtual_machine: bool = False  # a macOS virtual machine (kern.hv_vmm_present), e.g. a CI runner
    os_build: str | None = None  # the macOS build (kern.osversion), e.g. "24B83"
    mps_answer: MpsAnswer | None = None  # torch's own verdict on mps, cached; None: not asked yet
    # Probed only for machine 0 of several (with_addresses): psutil costs an import on every launch.
    addresses: tuple[str, ...] | None = None  # this machine's interface addresses; None: not probed
    name_lookup: tuple[str, tuple[str, ...]] | None = None  # a host name and what it resolved to
    # Probed only for several machines (with_own_name): this machine's host name and its addresses.
    own_name: tuple[str, tuple[str, ...]] | None = None
    accelerate_version: str | None = None  # installed Accelerate, e.g. "1.15.0"; None if absent
    caffeinate: bool = True  # macOS: caffeinate, which keeps the Mac awake, is on PATH
    on_battery: bool | None = None  # macOS: it runs on its battery; None: unknown

    @property
    def is_mac(self) -> bool:
        return self.system == "Darwin"

    @property
    def macos_text(self) -> str:
        return ".".join(map(str, self.macos_version or ()))


def probe() -> Machine:
    """The Machine this process runs on. Cheap: a few file reads; on macOS one sysctl call, one
    pmset call and the cached mps verdict."""
    system, arch = os.uname().sysname, os.uname().machine  # platform.* costs an import
    is_mac = system == "Darwin"
    mac = _mac_sysctls() if is_mac else {}
    torch_facts = _torch_build_facts()
    machine = Machine(
        system=system,
        arch=arch,
        macos_version=_macos_version(mac.get("kern.osproductversion")) if is_mac else None,
        rosetta=mac.get("sysctl.proc_translated") == "1",
        chip=mac.get("machdep.cpu.brand_string"),
        torch_version=torch_facts.get("__version__"),
        torch_cuda=torch_facts.get("cuda"),
        cuda_devices=() if is_mac else visible_nvidia_gpus(),
        cpu_count=os.cpu_count() or 1,
        python=sys.executable,
        virtual_machine=mac.get("kern.hv_vmm_present") == "1",
        os_build=mac.get("kern.osversion"),
        # Accelerate's faults the plan knows are on mps only: not read elsewhere.
        accelerate_version=_accelerate_version() if is_mac else None,
        **(_sleep_facts() if is_mac else {"caffeinate": False}),
    )
    key = mps_cache_key(machine)
    if not key:  # not a Mac with torch: no verdict is kept
        return machine
    from mpslaunch.machine import torch_check

    return machine._replace(mps_answer=torch_check.read_cached(key))


def verify_mps(machine: Machine, timeout: float) -> Machine:
    """Ask torch in a child Python whether mps works here; the machine with its verdict, cached.
    A check that gives no verdict in time leaves the machine as it was."""
    from mpslaunch.machine import torch_check

    return with_torch_facts(machine, torch_check.run_torch_check(machine.python, timeout))


def with_torch_facts(machine: Machine, facts: dict) -> Machine:
    """The machine with the mps verdict in a torch check's facts; on a Mac it is also cached when
    it is torch's own (a check that could not ask torch is asked again next time)."""
    from mpslaunch.machine import torch_check

    answer = torch_check.mps_answer(facts)
    if answer is None:
        return machine
    key = mps_cache_key(machine)
    if key and torch_check.is_torchs_own(facts):
        torch_check.save(key, answer)
    return machine._replace(mps_answer=answer)


def mps_cache_key(machine: Machine) -> str | None:
    """What the verdict holds for: this Python, this torch, this macOS build; None off a Mac."""
    if not (machine.is_mac and machine.torch_version and machine.os_build):
        return None
    from mpslaunch.machine import torch_check

    return torch_check.cache_key(machine.python, machine.torch_version, machine.os_build)


def version_tuple(text: str | None) -> tuple[int, ...]:
    """'2.14.1+cu130' -> (2, 14, 1); leading numeric parts only."""
    # str tests (isdecimal is regex's \d), not a regular expression compiled at every launch
    numbers = "".join(takewhile(lambda char: char.isdecimal() or char == ".", text or ""))
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


def memory_pressure_level() -> int | None:
    """macOS: the kernel's memory-pressure level (1 normal, 2 warning, 4 critical); None
    elsewhere or when unknown."""
    if os.uname().sysname != "Darwin":
        return None
    level = _sysctl("kern.memorystatus_vm_pressure_level")
    return int(level) if level and level.isdigit() else None


def memory_stall_microseconds() -> int | None:
    """Linux: how long, in all, some process has waited for memory since boot (pressure stall
    information, /proc/pressure/memory "some ... total="); None where the kernel has none."""
    try:
        with open("/proc/pressure/memory", encoding="ascii") as lines:
            first = lines.readline()
    except OSError:
        return None
    found = re.search(r"\btotal=(\d+)", first)
    return int(found.group(1)) if first.startswith("some") and found else None


def peak_resident_bytes(pid: int) -> int | None:
    """Linux: the most resident memory process `pid` has had (VmHWM); None elsewhere or once
    it is gone."""
    kib = _proc_field(f"/proc/{pid}/status", "VmHWM")
    return int(kib.split()[0]) * 1024 if kib else None


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


def _macos_version(product_version: str | None) -> tuple[int, ...] | None:
    """sysctl's macOS version, else platform.mac_ver()'s. A Python built with an SDK older than
    macOS 26 is told 16.x there: that is 26.x (docs/mps-facts.md: Where torch's own answer and
    the platform disagree)."""
    if not product_version:
        import platform

        product_version = platform.mac_ver()[0]
    version = version_tuple(product_version)
    if version[:1] == (16,):
        version = (26, *version[1:])
    return version or None


def _mac_sysctls() -> dict[str, str]:
    try:
        done = subprocess.run(["sysctl", *_MAC_SYSCTLS], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_sysctl(done.stdout)  # an unknown name fails the call but not the others' lines


def parse_sysctl(text: str) -> dict[str, str]:
    """'kern.osversion: 24B83' lines (macOS sysctl without -n) -> {name: value}, non-empty only."""
    found = {}
    for line in text.splitlines():
        name, colon, value = line.partition(": ")
        if colon and name in _MAC_SYSCTLS and value.strip():
            found[name] = value.strip()
    return found


def _sysctl(name: str) -> str | None:
    try:
        done = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _torch_build_facts() -> dict[str, str]:
    """`__version__` and `cuda` from torch/version.py, read as text: importing torch costs seconds
    (and importlib.metadata, an import of its own on every launch)."""
    found = _assignments(_package_text("torch", "version.py"), "__version__|cuda")
    return {name: value.split("+")[0] if name == "__version__" else value for name, value in found}


def _sleep_facts() -> dict:
    """macOS: whether caffeinate is on PATH, and whether the Mac runs on its battery."""
    from mpslaunch.machine import power

    return {"caffeinate": power.caffeinate_on_path(), "on_battery": power.on_battery()}


def _accelerate_version() -> str | None:
    """Accelerate's `__version__` from its __init__.py, read as text (importing it imports torch)."""
    found = dict(_assignments(_package_text("accelerate", "__init__.py"), "__version__"))
    return found.get("__version__")


def _package_text(package: str, file: str) -> str:
    """The text of `file` in an installed package's folder, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return ""
    try:
        with open(os.path.join(next(iter(spec.submodule_search_locations)), file)) as stream:
            return stream.read()
    except OSError:
        return ""


def _assignments(text: str, names: str) -> list[tuple[str, str]]:
    """(name, string) for each top-level `name = "string"` of those `names` (a regex) in `text`."""
    return re.findall(rf"^({names})\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)


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
    # os.path, not pathlib: the launch path does not need pathlib's import.
    proc_dir = "/proc/driver/nvidia/gpus"
    if os.path.isdir(proc_dir):
        return tuple(
            _gpu_model(os.path.join(proc_dir, gpu, "information"))
            for gpu in sorted(os.listdir(proc_dir))
        )
    # Containers often expose only the device nodes /dev/nvidia0, /dev/nvidia1, ...
    try:
        devices = os.listdir("/dev")
    except OSError:
        devices = []
    return tuple(
        "NVIDIA GPU"
        for name in devices
        if name.startswith("nvidia") and name[len("nvidia") :].isdecimal()
    )


def _gpu_model(information: str) -> str:
    try:
        with open(information) as stream:
            found = re.search(r"^Model:\s*(.+)$", stream.read(), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1).strip() if found else "NVIDIA GPU"
