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
from mpslaunch.plan import (
    Cluster,
    Decision,
    LaunchPlan,
    checks_main_address,
    decide_settings,
    for_target,
    mps_problem,
    settle,
    slurm_cluster,
    torchrun_layer,
    with_slurm_config,
)
from mpslaunch.settings import (
    COMMAND_LINE,
    LaunchOptions,
    LaunchRequest,
    Layer,
    Profile,
    ProfileFile,
    file_layer,
    merge,
    options_layer,
    profile_files,
    request_problem,
)

MPS_CHECK_TIMEOUT_SECONDS = 60.0  # a first `import torch` on a Mac can take a while


def prepare(
    options: LaunchOptions,
    profile: str | None = None,
    config_file: str | None = None,
    quiet: bool = False,
    target_is_file: bool = True,
    environ: Mapping[str, str] = os.environ,
    *,
    loaded: ProfileFile | None = None,
    machine: Machine | None = None,
    asked_in: str = COMMAND_LINE,
) -> Decision:
    """The plan for a LaunchRequest (a LaunchPlan), or for LaunchOptions alone the Decision for
    any target (`env`, `config show`); an MpslaunchError says what to change.

    The options are checked once, the target's existence (`target_is_file`: a script, module or
    executable, not a Python function), the profile read once and the layers settled once.
    `loaded`: the profile file the caller has read already, and reports itself. `machine`: a
    machine described, or already checked by the caller, taken as it is; by default this one,
    probed, with torch asked about mps when the plan is for mps and nothing is known yet.
    `asked_in`: where the options were given (COMMAND_LINE, or API for mpslaunch.launch()),
    as messages name them."""
    problem = request_problem(options)
    if problem:
        raise MpslaunchError(problem)
    targeted = isinstance(options, LaunchRequest)
    if isinstance(options, LaunchRequest) and target_is_file:
        check_target(options)
    reported = loaded is None
    loaded = loaded or profile_files.read_active(config_file, profile)
    cluster, layers = _layers(loaded, options, asked_in, environ)
    settings = settle(*layers)
    here = _machine_for(settings, machine or machine_probe.probe())
    decision = decide_settings(settings, options, here, environ, cluster.place)
    if machine is None and _asks_torch_about_mps(here, decision.device):
        here = _verified(here, quiet)
        decision = decide_settings(settings, options, here, environ, cluster.place)
    if reported and loaded.translation:
        output.note(accelerate_note(loaded, here), quiet)
        for warning in loaded.translation.warnings:
            output.warning(warning)
    if not targeted:
        return decision
    plan = _in_cluster(for_target(decision, options, here))
    _check_log_dir(plan)
    return plan


def _layers(
    loaded: ProfileFile, options: LaunchOptions, asked_in: str, environ: Mapping[str, str]
) -> tuple[Cluster, tuple[Layer, ...]]:
    """The SLURM step this launcher runs in, and the settings' layers over the defaults, weakest
    first: what the step derives (a port), the profile file in force, the options, then the
    clusters' facts (the step's, torchrun's PET_ variables)."""
    user = file_layer(loaded), options_layer(options, asked_in)
    cluster = slurm_cluster(merge(*user), environ)
    return cluster, (cluster.derived, *user, cluster.facts, torchrun_layer(environ))


def _in_cluster(plan: LaunchPlan) -> LaunchPlan:
    """In a SLURM step: the plan with what the cluster's configuration says about stopping it
    (asked of its controller only there)."""
    if plan.cluster is None:
        return plan
    config = machine_probe.slurm_config()
    place, warnings = with_slurm_config(
        plan.cluster, plan.grace_period, config.kill_wait, config.proctrack
    )
    return plan._replace(cluster=place, warnings=plan.warnings + warnings)


def _check_log_dir(plan: LaunchPlan) -> None:
    """A --log_dir that cannot be a folder is refused before the plan is announced or shown."""
    if plan.log_dir:
        from mpslaunch.run import log_dir_problem

        problem = log_dir_problem(plan.log_dir)
        if problem:
            raise MpslaunchError(problem)


def _verified(machine: Machine, quiet: bool) -> Machine:
    """The machine with torch's verdict on mps, asked in a child (and kept for later launches)."""
    output.say(
        "checking once that torch can use mps with this Python, torch and macOS (the "
        "answer is kept for later launches)",
        quiet,
    )
    machine = machine_probe.verify_mps(machine, MPS_CHECK_TIMEOUT_SECONDS)
    if machine.mps_answer is None:
        output.warning(
            f"torch's mps check gave no answer within {MPS_CHECK_TIMEOUT_SECONDS:g} "
            "s; planning on the platform facts alone (`mpslaunch env` checks again)"
        )
    return machine


def _machine_for(settings: Profile, machine: Machine) -> Machine:
    """The machine, with its network addresses when it is machine 0 of several (checked
    against main_process_ip), and with what its host name stands for when it is one of several."""
    if checks_main_address(settings) and settings.main_process_ip is not None:
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
    if loaded.translation and loaded.translation.basic_cpu and mps_problem(machine) is None:
        note += (
            "; its use_cpu: true is what `accelerate config default` writes on every Mac "
            "without asking, so this runs on cpu as it says: give --device mps to use the "
            "GPU, or import it with `mpslaunch config --from_accelerate`"
        )
    return note


def announce(plan: LaunchPlan, quiet: bool = False, stream=None) -> None:
    """The plan's warnings on stderr, then (unless quiet) its one-line summary on `stream`;
    nothing in rank mode but from rank 0."""
    if plan.silent_rank:
        return
    for warning in plan.warnings:
        output.warning(warning)
    if not quiet:
        print(plan.summary(), file=stream or sys.stderr, flush=True)
