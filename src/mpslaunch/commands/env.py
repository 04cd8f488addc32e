"""Print the facts a bug report needs, as a fenced Markdown block to paste as is (or --json).

It lists: mpslaunch, Python, the platform, macOS version and chip where present, the versions
of torch, torchvision and accelerate, whether MPS is built and whether it works, the CUDA
devices torch sees, the relevant environment variables (PYTORCH_*, MPSLAUNCH_*, ACCELERATE_*,
CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS), the profile in force, and what `mpslaunch launch` would
choose with it on this machine.

"MPS works" is proven, not assumed: a separate Python process (this one never imports torch)
allocates a small tensor on mps, multiplies it and synchronizes, within a time limit. The MPS
line reads: not built (no MPS in this torch: every Linux and Windows build), built, unavailable
(no usable Metal device, e.g. a sandbox or a CI runner), works, fails: <error>, or timed out.
The same process lists the CUDA devices torch sees, with their compute capability.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import subprocess
from typing import Any

from mpslaunch import __version__
from mpslaunch import machine as machine_probe
from mpslaunch import profile as profiles
from mpslaunch.errors import MpslaunchError
from mpslaunch.machine import Machine
from mpslaunch.commands.options import add_profile_options
from mpslaunch.plan import LaunchRequest, resolve

CHECK_TIMEOUT_SECONDS = 20.0
ENV_PREFIXES = ("PYTORCH_", "MPSLAUNCH_", "ACCELERATE_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY")  # never paste these into a public issue
_MARK = "MPSLAUNCH-TORCH-CHECK "

# Runs in the child Python. Prints one marked JSON line; torch's own warnings go elsewhere.
TORCH_CHECK = r"""
import json, sys
facts = {}
try:
    import torch
except Exception as error:
    facts["torch_error"] = f"{type(error).__name__}: {error}"
    print("MPSLAUNCH-TORCH-CHECK " + json.dumps(facts), flush=True)
    sys.exit(0)
facts["torch"] = torch.__version__
facts["torch_cuda"] = torch.version.cuda
mps = getattr(torch.backends, "mps", None)
facts["mps_built"] = bool(mps is not None and mps.is_built())
facts["mps_available"] = bool(facts["mps_built"] and mps.is_available())
if facts["mps_available"]:
    try:
        a = torch.full((64, 64), 1.0, device="mps")
        total = (a @ a).sum()
        torch.mps.synchronize()
        value = total.item()
        facts["mps_check"] = "works" if value == 64.0 ** 3 else f"fails: 64x64 matmul gave {value}, expected {64.0 ** 3}"
    except Exception as error:
        facts["mps_check"] = "fails: " + " ".join(f"{type(error).__name__}: {error}".split())[:300]
devices = []
try:
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(index)
            devices.append({"name": p.name, "capability": f"{p.major}.{p.minor}",
                            "memory_gib": round(p.total_memory / 2 ** 30, 1)})
except Exception as error:
    facts["cuda_error"] = " ".join(f"{type(error).__name__}: {error}".split())[:300]
facts["cuda_devices"] = devices
print("MPSLAUNCH-TORCH-CHECK " + json.dumps(facts), flush=True)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the facts as JSON instead")
    add_profile_options(parser, profile_help="report this named profile",
                        file_help="report this profile file")
    parser.add_argument("--timeout", type=float, default=CHECK_TIMEOUT_SECONDS, metavar="SECONDS",
                        help=f"time limit for the torch/MPS check (default {CHECK_TIMEOUT_SECONDS:g})")


def main(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise MpslaunchError("--timeout must be a number of seconds above 0")
    facts = gather(machine_probe.probe(), os.environ, args.config_file, args.profile, args.timeout)
    print(json.dumps(facts, indent=2) if args.json else as_markdown(facts))
    return 0


# ---------------------------------------------------------------- gathering


def gather(machine: Machine, environ: dict[str, str] | os._Environ, config_file: str | None,
           profile_name: str | None, timeout: float = CHECK_TIMEOUT_SECONDS) -> dict[str, Any]:
    torch_facts = run_torch_check(machine.python, timeout) if machine.torch_version else {"torch_error": "not installed"}
    facts: dict[str, Any] = {
        "mpslaunch": __version__,
        "python": f"{platform.python_version()} ({platform.python_implementation()}) at {machine.python}",
        "platform": f"{platform.platform()} ({machine.system} {machine.arch})",
    }
    if machine.is_mac:
        facts["macos"] = machine.macos_text or "unknown"
        facts["chip"] = machine.chip or "unknown"
        facts["rosetta"] = machine.rosetta
    facts["cpu_cores"] = machine.cpu_count
    facts["torch"] = torch_facts.get("torch") or machine.torch_version or "not installed"
    facts["torch_cuda_build"] = machine.torch_cuda or "none"
    facts["torchvision"] = installed_version("torchvision") or "not installed"
    facts["accelerate"] = installed_version("accelerate") or "not installed"
    facts["mps"] = mps_status(torch_facts, timeout)
    facts["cuda"] = cuda_status(torch_facts, machine)
    facts["nvidia_gpus_visible"] = list(machine.cuda_devices)
    facts["environment"] = relevant_environment(environ)
    facts.update(profile_facts(machine, environ, config_file, profile_name))
    return facts


def run_torch_check(python: str, timeout: float, code: str = TORCH_CHECK) -> dict[str, Any]:
    """Run the torch check in a child Python; its facts, or {"check_error": why it gave none}."""
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"timed_out": True}
    except OSError as error:
        return {"check_error": f"cannot start {python}: {error.strerror}"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):])
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"check_error": f"the check process exited with code {done.returncode}: {last[:300]}"}


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def mps_status(facts: dict[str, Any], timeout: float) -> str:
    if facts.get("timed_out"):
        return f"timed out: the check (import torch, one tiny mps matmul) took over {timeout:g} s"
    if "check_error" in facts:
        return f"fails: {facts['check_error']}"
    if "torch_error" in facts:
        return f"unknown: torch {facts['torch_error']}"
    if not facts.get("mps_built"):
        return "not built"
    if not facts.get("mps_available"):
        return "built, unavailable (no usable Metal device: a sandbox, VM or CI runner?)"
    return facts.get("mps_check", "fails: no result")


def cuda_status(facts: dict[str, Any], machine: Machine) -> str:
    if "cuda_error" in facts:
        return f"fails: {facts['cuda_error']}"
    devices = facts.get("cuda_devices")
    if devices is None:  # the check gave no facts; say what the driver shows
        return f"{len(machine.cuda_devices)} NVIDIA GPU(s) visible to the driver; torch not checked"
    if not devices:
        return "no devices" + ("" if facts.get("torch_cuda") else " (torch is not a CUDA build)")
    return "; ".join(f"{i}: {d['name']} (capability {d['capability']}, {d['memory_gib']} GiB)"
                     for i, d in enumerate(devices))


def relevant_environment(environ) -> dict[str, str]:
    found = {}
    for name in sorted(environ):
        if name.startswith(ENV_PREFIXES) or name in ENV_NAMES:
            secret = any(word in name.upper() for word in _SECRET_WORDS)
            found[name] = "<set, not shown>" if secret else environ[name]
    return found


def profile_facts(machine: Machine, environ, config_file: str | None,
                  profile_name: str | None) -> dict[str, Any]:
    try:
        profile, path = profiles.load_active(config_file, profile_name)
    except MpslaunchError as error:
        return {"profile_path": None, "profile": f"unreadable: {error}", "launcher_choice": "none: no profile"}
    values = profile.to_dict() if path else "none: defaults"
    try:
        plan = resolve(profile, LaunchRequest(target="script.py"), machine, environ)
        processes = f"{plan.num_processes} process(es) x {plan.num_machines} machine(s)"
        choice = f"{plan.reason}; precision {plan.mixed_precision}; {processes}"
    except MpslaunchError as error:
        choice = f"refuses: {error}"
    return {"profile_path": str(path) if path else None, "profile": values, "launcher_choice": choice}


# ---------------------------------------------------------------- printing


_LABELS = {
    "mpslaunch": "mpslaunch", "python": "Python", "platform": "Platform", "macos": "macOS",
    "chip": "Chip", "rosetta": "Rosetta (x86_64 Python on Apple silicon)", "cpu_cores": "CPU cores",
    "torch": "torch", "torch_cuda_build": "torch CUDA build", "torchvision": "torchvision",
    "accelerate": "accelerate", "mps": "MPS", "cuda": "CUDA devices (torch)",
    "nvidia_gpus_visible": "NVIDIA GPUs (driver)",
}


def as_markdown(facts: dict[str, Any]) -> str:
    lines = ["```text"]
    for key, label in _LABELS.items():
        if key in facts:
            lines.append(f"- {label}: {_text(facts[key])}")
    environment = facts["environment"]
    lines.append("- Environment:" + ("" if environment else " none of PYTORCH_*, MPSLAUNCH_*, "
                                     "ACCELERATE_*, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS is set"))
    lines += [f"    {name}={value}" for name, value in environment.items()]
    profile = facts["profile"]
    if isinstance(profile, dict):
        lines.append(f"- Profile: {facts['profile_path']}")
        lines += [f"    {line}" for line in profiles.to_yaml(profiles.Profile(**profile)).splitlines()[1:]]
    else:
        lines.append(f"- Profile: {profile}")
    lines.append(f"- Launcher would choose: {facts['launcher_choice']}")
    lines.append("```")
    return "\n".join(_no_fence(line) if 0 < i < len(lines) - 1 else line for i, line in enumerate(lines))


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def _no_fence(line: str) -> str:
    """A ``` inside a value (an error message, a variable) would end the block early."""
    return re.sub(r"`{3,}", lambda found: "'" * len(found.group(0)), line)
