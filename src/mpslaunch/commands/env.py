"""`mpslaunch env`: the facts a bug report needs, as a Markdown block (or JSON).

"MPS works" is proven, not assumed: a separate Python (this one never imports torch) runs a tiny
matmul on mps within a time limit, and lists the CUDA devices torch sees. On a Mac its verdict
replaces the one `launch` keeps for this Python, torch and macOS build.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
from typing import Any

from mpslaunch import __version__
from mpslaunch import machine as machine_probe
from mpslaunch.launcher import prepare
from mpslaunch.machine import (
    CHECK_TIMEOUT_SECONDS,
    Machine,
    SlurmVariableError,
    is_torchs_own,
    run_torch_check,
    slurm_allocation,
    slurm_step,
)
from mpslaunch.output import MpslaunchError, one_line
from mpslaunch.settings import (
    LaunchOptions,
    Profile,
    add_table_options,
    profile_files,
    unused_default_note,
)

HELP = """\
Print the facts a bug report needs, as a Markdown block to paste as it is: the
versions of mpslaunch, Python, torch, torchvision and accelerate, the platform (the
macOS version, build and chip on a Mac, and whether it is a virtual machine), whether
MPS works (proven by a tiny computation in a separate Python; on a Mac this answer
replaces the one `mpslaunch launch` keeps), the CUDA devices torch sees, the SLURM
job or step it runs in, the relevant environment variables (secrets hidden), the
profile in force and what `mpslaunch launch` would choose.

examples:
  mpslaunch env
  mpslaunch env --json
  mpslaunch env --profile cpu4
"""
ENV_PREFIXES = ("PYTORCH_", "MPSLAUNCH_", "ACCELERATE_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY")  # never paste these into a public issue


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the facts as JSON instead of a Markdown block"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=CHECK_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="time limit for the torch and MPS check (default: %(default)g)",
    )
    which = parser.add_argument_group("which profile (default: default.yaml in the config folder)")
    add_table_options(which, "profile", "config_file")


def main(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise MpslaunchError("--timeout must be a number of seconds above 0")
    facts = gather(machine_probe.probe(), os.environ, args.config_file, args.profile, args.timeout)
    print(json.dumps(facts, indent=2) if args.json else as_markdown(facts))
    return 0


# ---------------------------------------------------------------- gathering


def gather(
    machine: Machine,
    environ: dict[str, str] | os._Environ,
    config_file: str | None,
    profile_name: str | None,
    timeout: float = CHECK_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    torch_facts = (
        run_torch_check(machine.python, timeout)
        if machine.torch_version
        else {"torch_error": "not installed"}
    )
    if machine.torch_version:
        machine = machine_probe.with_torch_facts(machine, torch_facts)  # cached on a Mac
    facts: dict[str, Any] = {
        "mpslaunch": __version__,
        "python": f"{platform.python_version()} ({platform.python_implementation()}) at {machine.python}",
        "platform": f"{platform.platform()} ({machine.system} {machine.arch})",
    }
    if machine.is_mac:
        facts["macos"] = machine.macos_text or "unknown"
        facts["chip"] = machine.chip or "unknown"
        facts["rosetta"] = machine.rosetta
        facts["virtual_machine"] = machine.virtual_machine
        facts["macos_build"] = machine.os_build or "unknown"
    facts["cpu_cores"] = machine.cpu_count
    facts["torch"] = torch_facts.get("torch") or machine.torch_version or "not installed"
    facts["torch_cuda_build"] = machine.torch_cuda or "none"
    facts["torchvision"] = installed_version("torchvision") or "not installed"
    facts["accelerate"] = installed_version("accelerate") or "not installed"
    facts["mps"] = mps_status(torch_facts, timeout)
    if machine.is_mac:
        facts["mps_verdict"] = kept_verdict(machine, torch_facts)
    facts["cuda"] = cuda_status(torch_facts, machine)
    facts["nvidia_gpus_visible"] = list(machine.cuda_devices)
    facts["slurm"] = slurm_status(environ)
    facts["environment"] = relevant_environment(environ)
    facts.update(profile_facts(machine, environ, config_file, profile_name))
    facts["accelerate_default_config"] = unused_default_note(environ)
    return facts


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def kept_verdict(machine: Machine, torch_facts: dict[str, Any]) -> str:
    """What `launch` keeps from this check on a Mac: torch's own answer, or nothing."""
    if not machine.torch_version:
        return "none: torch is not installed"
    if machine.mps_answer is None:
        return "none: the check gave no answer in time; nothing was kept"
    if not is_torchs_own(torch_facts):
        return (
            f"none: the check could not ask torch ({machine.mps_answer.detail}); nothing was kept"
        )
    return machine.mps_answer.describe()


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
        return "built, unavailable: " + facts.get("mps_reason", "torch gives no reason")
    return facts.get("mps_check", "fails: no result")


def cuda_status(facts: dict[str, Any], machine: Machine) -> str:
    if "cuda_error" in facts:
        return f"fails: {facts['cuda_error']}"
    devices = facts.get("cuda_devices")
    if devices is None:  # the check gave no facts; say what the driver shows
        return f"{len(machine.cuda_devices)} NVIDIA GPU(s) visible to the driver; torch not checked"
    if not devices:
        return "no devices" + ("" if facts.get("torch_cuda") else " (torch is not a CUDA build)")
    return "; ".join(
        f"{i}: {d['name']} (capability {d['capability']}, {d['memory_gib']} GiB)"
        for i, d in enumerate(devices)
    )


def slurm_status(environ) -> str:
    """The srun step this runs in, else the SLURM job seen from outside any step, else none."""
    try:
        step = slurm_step(environ)
    except SlurmVariableError as error:
        return f"unreadable: {error}"
    if step is not None:
        return "srun step: " + step.describe()
    allocation = slurm_allocation(environ)
    return allocation.describe() if allocation else "none"


def relevant_environment(environ) -> dict[str, str]:
    found = {}
    for name in sorted(environ):
        if name.startswith(ENV_PREFIXES) or name in ENV_NAMES:
            secret = any(word in name.upper() for word in _SECRET_WORDS)
            found[name] = "<set, not shown>" if secret else environ[name]
    return found


def profile_facts(
    machine: Machine, environ, config_file: str | None, profile_name: str | None
) -> dict[str, Any]:
    """The profile in force and what `launch` would choose with it on `machine` (whose mps verdict
    the check above has just given)."""
    try:
        loaded = profile_files.read_active(config_file, profile_name)
    except MpslaunchError as error:
        return {
            "profile_path": None,
            "profile": f"unreadable: {error}",
            "launcher_choice": "none: no profile",
            "launcher_warnings": [],
        }
    profile, path = loaded.profile, loaded.path
    values = profile.to_dict() if path else "none: defaults"
    try:
        decision = prepare(LaunchOptions(), environ=environ, loaded=loaded, machine=machine)
        choice, warnings = decision.choice(), list(decision.warnings)
    except MpslaunchError as error:
        choice, warnings = f"refuses: {error}", []
    return {
        "profile_path": str(path) if path else None,
        "profile": values,
        "launcher_choice": choice,
        "launcher_warnings": warnings,
    }


# ---------------------------------------------------------------- printing


_LABELS = {
    "mpslaunch": "mpslaunch",
    "python": "Python",
    "platform": "Platform",
    "macos": "macOS",
    "chip": "Chip",
    "rosetta": "Rosetta (x86_64 Python on Apple silicon)",
    "virtual_machine": "Virtual machine",
    "macos_build": "macOS build",
    "cpu_cores": "CPU cores",
    "torch": "torch",
    "torch_cuda_build": "torch CUDA build",
    "torchvision": "torchvision",
    "accelerate": "accelerate",
    "mps": "MPS",
    "mps_verdict": "MPS verdict kept for launches",
    "cuda": "CUDA devices (torch)",
    "nvidia_gpus_visible": "NVIDIA GPUs (driver)",
    "slurm": "SLURM",
}


def as_markdown(facts: dict[str, Any]) -> str:
    lines = ["```text"]
    for key, label in _LABELS.items():
        if key in facts:
            lines.append(f"- {label}: {_text(facts[key])}")
    environment = facts["environment"]
    lines.append(
        "- Environment:"
        + (
            ""
            if environment
            else " none of PYTORCH_*, MPSLAUNCH_*, "
            "ACCELERATE_*, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS is set"
        )
    )
    lines += [f"    {name}={value}" for name, value in environment.items()]
    profile = facts["profile"]
    if isinstance(profile, dict):
        lines.append(f"- Profile: {facts['profile_path']}")
        lines += [
            f"    {line}" for line in profile_files.to_yaml(Profile(**profile)).splitlines()[1:]
        ]
    else:
        lines.append(f"- Profile: {profile}")
    lines.append(f"- Launcher would choose: {facts['launcher_choice']}")
    lines += [f"- Launcher would warn: {warning}" for warning in facts.get("launcher_warnings", [])]
    if facts.get("accelerate_default_config"):
        lines.append(f"- Accelerate default config: {facts['accelerate_default_config']}")
    lines.append("```")
    return "\n".join(
        _no_fence(one_line(line)) if 0 < i < len(lines) - 1 else line
        for i, line in enumerate(lines)
    )


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def _no_fence(line: str) -> str:
    """A ``` inside a value (an error message, a variable) would end the block early, as a
    newline in one would start a line of its own (one_line escapes it)."""
    return re.sub(r"`{3,}", lambda found: "'" * len(found.group(0)), line)
