"""The launch core that `mpslaunch launch`, `mpslaunch test` and `mpslaunch.launch()` share:
`prepare` (the options checked, the profile read once, this machine probed, the plan resolved
once) and `execute` (the plan run). Imports stay light: the one-process path never imports torch.

On a Mac the first plan for mps with a given Python, torch and macOS build asks torch in a
child; later ones read the cached verdict.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping

from mpslaunch import machine as machine_probe
from mpslaunch import output, profile_files
from mpslaunch.errors import MpslaunchError
from mpslaunch.machine import Machine
from mpslaunch.options import LaunchRequest, request_problem
from mpslaunch.plan import LaunchPlan, checks_main_address, apply_flags, decide, for_target, mps_problem
from mpslaunch.targets import check_target

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


def accelerate_note(loaded: profile_files.ProfileFile, machine: Machine) -> str:
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


def describe(plan: LaunchPlan) -> str:
    """What --dry-run prints."""
    if plan.engine == "single":
        text = plan.describe()
    else:
        from mpslaunch.run.torchrun import elastic as torchrun  # imports torch: several processes only

        text = torchrun.describe(plan)
    return text + (f"\nmps check:       {plan.mps_verdict}" if plan.mps_verdict else "")


def execute(plan: LaunchPlan, report: bool = False) -> int:
    """Run the plan; the child's exit code (128+N when signal N ended it). `report`: memory
    warnings and the end-of-run line (launch without -q)."""
    from mpslaunch.run.companion import Watch

    watch = Watch.for_plan(plan, report, os.environ)
    if plan.engine == "single":
        from mpslaunch.run.single import run_child

        return run_child(plan.command, plan.env, plan.grace_period, plan.log_dir, watch,
                         plan.removed)
    if threading.current_thread() is not threading.main_thread():
        raise MpslaunchError("several processes of a script are started from the main thread "
                             "only (stopping them needs its signal handlers); call from the main "
                             "thread, or run one process here")
    from mpslaunch.run.torchrun import elastic as torchrun

    return torchrun.run(plan, plan.grace_period, watch)
