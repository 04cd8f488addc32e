"""`prepare`: from a request to its plan, for every door (the options checked, the profile read
once, this machine probed, the plan resolved once), and `announce`, the plan's lines before a
run. Imports stay light: the one-process path never imports torch.

On a Mac the first plan for mps with a given Python, torch and macOS build asks torch in a
child; later ones read the cached verdict.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from mpslaunch import machine as machine_probe
from mpslaunch import output
from mpslaunch.launcher.targets import check_target
from mpslaunch.machine import Machine
from mpslaunch.output import MpslaunchError
from mpslaunch.plan import LaunchPlan, apply_flags, checks_main_address, decide, for_target, mps_problem
from mpslaunch.settings import LaunchRequest, ProfileFile, profile_files, request_problem

MPS_CHECK_TIMEOUT_SECONDS = 60.0  # a first `import torch` on a Mac can take a while


def prepare(request: LaunchRequest, profile: str | None = None, config_file: str | None = None,
            quiet: bool = False, target_is_file: bool = True,
            environ: Mapping[str, str] = os.environ) -> LaunchPlan:
    """The plan for `request`, or an MpslaunchError that says what to change. `target_is_file`:
    the target is a script, module or executable that must exist (not a Python function)."""
    problem = request_problem(request)
    if problem:
        raise MpslaunchError(problem)
    if target_is_file:
        check_target(request)
    loaded = profile_files.read_active(config_file, profile)
    source = str(loaded.path) if loaded.path else None  # named in messages about its values
    machine = _machine_for(apply_flags(loaded.profile, request))
    decision = decide(loaded.profile, request, machine, environ, source)
    if _asks_torch_about_mps(machine, decision.device):
        output.say("checking once that torch can use mps with this Python, torch and macOS (the "
                   "answer is kept for later launches)", quiet)
        machine = machine_probe.verify_mps(machine, MPS_CHECK_TIMEOUT_SECONDS)
        if machine.mps_answer is None:
            output.warning(f"torch's mps check gave no answer within {MPS_CHECK_TIMEOUT_SECONDS:g} "
                           "s; planning on the platform facts alone (`mpslaunch env` checks again)")
        decision = decide(loaded.profile, request, machine, environ, source)
    if loaded.translation:
        output.note(accelerate_note(loaded, machine), quiet)
        for warning in loaded.translation.warnings:
            output.warning(warning)
    return for_target(decision, request, machine)


def _machine_for(settings) -> Machine:
    """This machine, with its network addresses when it is machine 0 of several (checked
    against main_process_ip), and with what its host name stands for when it is one of several."""
    machine = machine_probe.probe()
    if checks_main_address(settings):
        machine = machine_probe.with_addresses(machine, settings.main_process_ip)
    if settings.num_machines > 1:  # gloo advertises what this machine's name stands for
        machine = machine_probe.with_own_name(machine)
    return machine


def _asks_torch_about_mps(machine: Machine, device: str) -> bool:
    """A plan for mps on a Mac where torch was never asked about this Python, torch and macOS."""
    return machine.is_mac and machine.mps_answer is None and device == "mps"


def accelerate_note(loaded: ProfileFile, machine: Machine) -> str:
    """For a profile file that is an Accelerate config, read as the profile it means."""
    note = f"{loaded.path} was read as an Accelerate config file"
    if loaded.translation.basic_cpu and mps_problem(machine) is None:
        note += ("; its use_cpu: true is what `accelerate config default` writes on every Mac "
                 "without asking, so this runs on cpu as it says: give --device mps to use the "
                 "GPU, or import it with `mpslaunch config --from-accelerate`")
    return note


def announce(plan: LaunchPlan, quiet: bool = False, stream=None) -> None:
    """The plan's warnings on stderr, then (unless quiet) its one-line summary on `stream`."""
    for warning in plan.warnings:
        output.warning(warning)
    if not quiet:
        print(plan.summary(), file=stream or sys.stderr, flush=True)
