"""The plan: `decide(profile, options, machine, environ) -> Decision` (the device, precision,
processes and child variables, for any target), then `for_target(decision, request, machine) ->
LaunchPlan` (the command); `resolve` is the two in one. Command-line flags win over the profile
(`apply_flags`). The rules themselves are in device.py, processes.py and child.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mpslaunch.machine import Machine
from mpslaunch.output import MpslaunchError, one_line, shell_words
from mpslaunch.plan.child import (accelerate_environment, accelerate_notes,
                                  check_multi_gpu, child_command, child_environment, no_effect,
                                  other_launchers_variables, replaced_values, with_gpu_ids)
from mpslaunch.plan.device import check_precision, choose_device, dynamo_problem
from mpslaunch.plan.environment import REMOVED_WHY
from mpslaunch.plan.known_faults import warnings_for
from mpslaunch.plan.processes import (check_processes, default_processes, main_address_problem,
                                      own_name_problem, several_machines_settings)
from mpslaunch.settings import (DEFAULT_GRACE_SECONDS, KNOWN_KEYS, LaunchOptions, LaunchRequest,
                                Profile, check_profile, given_as, request_problem, source_of)


@dataclass(frozen=True)
class Decision:
    """What runs where, for any target: the device, the precision, the processes, the variables."""

    device: str  # "mps", "cuda" or "cpu"
    reason: str  # one line: why this device
    mixed_precision: str
    num_processes: int  # processes on this machine
    num_machines: int
    engine: str  # "single": one child process; "torchrun": torch.distributed.run
    env: Mapping[str, str]  # variables added to (or changed in) the user's environment
    settings: Profile  # the profile after the command-line flags were applied
    warnings: tuple[str, ...] = field(default=())
    one_per_gpu: bool = False  # num_processes was not given, so every visible GPU gets a process
    accelerate_notes: tuple[str, ...] = ()  # what each of Accelerate's options became
    replaced: Mapping[str, str] = field(default_factory=dict)  # the user's values that env overrides
    keep_awake: bool = False  # macOS: caffeinate holds off idle sleep while the run lasts
    removed: Mapping[str, str] = field(default_factory=dict)  # another launcher's, kept from the child

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_machines

    def choice(self) -> str:
        """One line: the device and why, the precision, the processes."""
        processes = f"{self.num_processes} process" + ("es" if self.num_processes > 1 else "")
        if self.num_machines > 1:
            processes += f" on each of {self.num_machines} machines"
        if self.one_per_gpu and self.num_processes > 1:
            processes += ", one per GPU (--num_processes 1 for one)"
        return f"{self.reason}; precision {self.mixed_precision}; {processes}"


@dataclass(frozen=True, kw_only=True)
class LaunchPlan(Decision):
    """A decision, and the command that runs the target with it."""

    command: tuple[str, ...]  # what each process runs: python script.py args...
    log_dir: str | None = None
    monitor_interval: float | None = None  # torchrun's --monitor-interval; None: ours
    no_python: bool = False  # command[0] is the target itself
    grace_period: float = DEFAULT_GRACE_SECONDS  # after Ctrl-C or SIGTERM, before the kill
    mps_verdict: str | None = None  # on a Mac: torch's answer about mps, for --dry_run

    def summary(self) -> str:
        """The one line printed before the child starts."""
        line = f"mpslaunch: {self.choice()}"
        if self.keep_awake:
            line += "; kept awake while it runs"
        if self.log_dir:
            line += f"; output also in {self.log_dir}"
        if self.replaced:
            line += "; replaced in your environment: " + ", ".join(
                f"{key}={old} (now {self.env[key]})" for key, old in sorted(self.replaced.items()))
        if self.removed:
            line += f"; removed from the script's environment ({REMOVED_WHY}): " + ", ".join(
                f"{key}={value}" for key, value in sorted(self.removed.items()))
        return line

    def describe(self) -> str:
        """What --dry_run prints: the plan, the command and the variables it adds."""
        lines = [
            f"device:          {self.device}",
            f"reason:          {self.reason}",
            f"mixed precision: {self.mixed_precision}",
            f"processes:       {self.num_processes} per machine, {self.num_machines} machine(s)"
            + (" (one per visible GPU)" if self.one_per_gpu and self.num_processes > 1 else ""),
            f"engine:          {self.engine}",
            *(["keep awake:      caffeinate -i -w <launcher pid> while the run lasts"]
              if self.keep_awake else []),
            f"command:         {shell_words(self.command)}",
            "environment added:",
            *(f"  {key}={one_line(value)}" + (f"   replaced (was {self.replaced[key]})"
                                     if key in self.replaced else "")
              for key, value in sorted(self.env.items())),
        ]
        if self.removed:
            lines.append(f"environment removed ({REMOVED_WHY}):")
            lines += [f"  {key}={value}" for key, value in sorted(self.removed.items())]
        if self.log_dir and self.engine == "single":
            lines.append(f"output also in:  {self.log_dir}/mpslaunch-<date>-<time>-<pid>/"
                         "stdout.log and stderr.log")
        lines += [f"accelerate option {text}" for text in self.accelerate_notes]
        lines += [f"warning: {text}" for text in self.warnings]
        return "\n".join(lines)


def decide(profile: Profile, options: LaunchOptions, machine: Machine,
           environ: Mapping[str, str], profile_file: str | None = None) -> Decision:
    """The device, precision, processes and variables for these options, whatever the target.
    `profile_file`: where the profile was read from, named in messages about its values."""
    return decide_settings(apply_flags(profile, options), options, machine, environ, profile_file)


def decide_settings(settings: Profile, options: LaunchOptions, machine: Machine,
                    environ: Mapping[str, str], profile_file: str | None = None) -> Decision:
    """decide() for `settings`, the profile the flags in `options` were applied to."""
    machine = with_gpu_ids(machine, settings.gpu_ids, source_of(options, "gpu_ids"), environ)
    device, reason = choose_device(settings.device, options, machine)
    one_per_gpu = settings.num_processes is None
    if one_per_gpu:
        settings = settings.replace(num_processes=default_processes(device, machine))
    check_precision(settings.mixed_precision, device, machine)
    problem = dynamo_problem(settings.dynamo_backend, device, machine, source_of(options, "dynamo_backend"))
    if problem:
        raise MpslaunchError(problem)
    check_processes(settings, device, machine,
                     given_as(options, "num_processes", settings.num_processes, profile_file))
    check_multi_gpu(options, settings, device)
    problem = main_address_problem(settings, machine) or own_name_problem(settings, device, machine,
                                                                          environ)
    if problem:
        raise MpslaunchError(problem)
    multi = settings.num_processes > 1 or settings.num_machines > 1
    env = child_environment(settings, device, machine, environ, multi)
    env.update(accelerate_environment(options, settings, device))
    return Decision(
        device=device,
        reason=reason,
        mixed_precision=settings.mixed_precision,
        num_processes=settings.num_processes,
        num_machines=settings.num_machines,
        engine="torchrun" if multi else "single",
        env=env,
        settings=settings,
        warnings=_warnings(settings, device, machine) + no_effect(options, settings, device, multi),
        one_per_gpu=one_per_gpu and device == "cuda",
        accelerate_notes=accelerate_notes(options, settings, device, env),
        replaced=replaced_values(env, environ),
        keep_awake=settings.keep_awake and machine.is_mac and machine.caffeinate,
        removed={} if multi else other_launchers_variables(environ),
    )


def for_target(decision: Decision, request: LaunchRequest, machine: Machine) -> LaunchPlan:
    """The plan that runs the request's target with this decision."""
    if request.no_python and request.module:
        raise MpslaunchError("-m and --no_python cannot be used together: -m runs a module with "
                             "python; give one of them")
    decided = {name: getattr(decision, name) for name in Decision.__dataclass_fields__}
    if request.no_python:
        decided["accelerate_notes"] += (f"--no_python: each process runs {request.target} "
                                        "itself, not with python",)
    return LaunchPlan(
        **decided,
        command=child_command(request, machine),
        log_dir=request.log_dir,
        monitor_interval=request.monitor_interval,
        no_python=request.no_python,
        grace_period=request.grace_period,
        mps_verdict=mps_verdict_text(machine) if machine.is_mac else None,
    )


def resolve(profile: Profile, request: LaunchRequest, machine: Machine,
            environ: Mapping[str, str]) -> LaunchPlan:
    """decide(), then the command for the request's target."""
    return for_target(decide(profile, request, machine, environ), request, machine)


def mps_verdict_text(machine: Machine) -> str:
    """The dry run's line about torch's verdict on mps."""
    if machine.mps_answer is None:
        return "not asked (only a plan for mps asks torch; `mpslaunch env` asks now)"
    return f"{machine.mps_answer.describe()}; `mpslaunch env` checks again"


# ---------------------------------------------------------------- precedence


def apply_flags(profile: Profile, options: LaunchOptions) -> Profile:
    """Command-line flags win over the profile; each is checked as the option table says."""
    problem = request_problem(options)
    if problem:
        raise MpslaunchError(problem)
    return with_flags(profile, options)


def with_flags(profile: Profile, options: LaunchOptions) -> Profile:
    """apply_flags() for options already checked against the option table."""
    if options.cpu and options.device not in (None, "cpu"):
        raise MpslaunchError(f"--cpu and --device {options.device} contradict each other; give one")
    changes = {key: getattr(options, key) for key in KNOWN_KEYS
               if getattr(options, key, None) is not None}
    if options.cpu:
        changes["device"] = "cpu"
    settings = profile.replace(**changes)
    problem = check_profile(settings)
    if problem:
        raise MpslaunchError(problem)
    return several_machines_settings(settings, options)


def _warnings(settings: Profile, device: str, machine: Machine) -> tuple[str, ...]:
    found = []
    if device == "cpu" and settings.num_processes > machine.cpu_count:
        found.append(f"{settings.num_processes} processes share {machine.cpu_count} CPU cores; "
                     "expect them to be slower than fewer processes")
    if device == "mps" and machine.virtual_machine:
        found.append("mps in a macOS virtual machine is known to fail (allocations refused, "
                     "results that differ); --device auto plans cpu here")
    found += warnings_for(machine.torch_version, machine.chip, machine.macos_version,
                          settings.mixed_precision, device, machine.accelerate_version)
    return (*found, *_sleep_warnings(settings, machine))


_SILENCE_SLEEP = "keep_awake: false in the profile (or --no_keep_awake) silences this"


def _sleep_warnings(settings: Profile, machine: Machine) -> tuple[str, ...]:
    """What may pause a run on a Mac (docs/mps-facts.md: Sleep on a Mac)."""
    if not (settings.keep_awake and machine.is_mac):
        return ()
    if not machine.caffeinate:
        return ("caffeinate is not on PATH (it is /usr/bin/caffeinate), so nothing keeps this "
                f"Mac awake: it may sleep and pause the run; {_SILENCE_SLEEP}",)
    if machine.on_battery:
        return ("this Mac runs on its battery: closing the lid sleeps it and pauses the run; "
                + _SILENCE_SLEEP,)
    return ()
