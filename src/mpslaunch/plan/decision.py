"""The plan: `decide(profile, options, machine, environ) -> Decision` (the device, precision,
processes and child variables, for any target), then `for_target(decision, request, machine) ->
LaunchPlan` (the command); `resolve` is the two in one. `settle` merges the settings' layers
(settings/layers.py: the defaults, a profile file, the command line, a cluster's facts) and
holds the rules between keys; `decide_settings` decides on what it gives. The rules themselves
are in device.py, processes.py and child.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from mpslaunch import Record, record
from mpslaunch.machine import Machine
from mpslaunch.output import MpslaunchError, one_line, shell_words
from mpslaunch.plan.child import (
    accelerate_environment,
    accelerate_notes,
    check_multi_gpu,
    child_command,
    child_environment,
    no_effect,
    other_launchers_variables,
    replaced_values,
    with_gpu_ids,
)
from mpslaunch.plan.device import check_precision, choose_device, dynamo_problem
from mpslaunch.plan.environment import REMOVED_WHY
from mpslaunch.plan.known_faults import warnings_for
from mpslaunch.plan.processes import (
    check_processes,
    default_processes,
    main_address_problem,
    own_name_problem,
    several_machines_settings,
)
from mpslaunch.plan.slurm import Place, rank_mode_problem, rank_variables
from mpslaunch.settings import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_PORT,
    LaunchOptions,
    LaunchRequest,
    Layer,
    Profile,
    ProfileFile,
    Settings,
    check_profile,
    file_layer,
    merge,
    options_layer,
    profile_layer,
    request_problem,
)

# The engines that run a plan: "single", one child process; "torchrun", torch.distributed.run.
# Each has its module in run/__init__.py's ENGINES.
SINGLE, TORCHRUN = "single", "torchrun"
ENGINES = (SINGLE, TORCHRUN)


@record
class Decision(Record):
    """What runs where, for any target: the device, the settings, the engine, the variables.
    Each setting is read in one place, `settings` (with where it came from); `device` is the
    device chosen for the setting's `auto`, `mps`, `cuda` or `cpu`."""

    device: str  # "mps", "cuda" or "cpu"
    reason: str  # one line: why this device
    engine: str  # one of ENGINES
    env: Mapping[str, str]  # variables added to (or changed in) the user's environment
    # Every profile key after the layers: num_processes (on this machine: the count, one per GPU
    # when none was given), num_machines, mixed_precision, machine_rank, the main address, ...
    settings: Settings
    warnings: tuple[str, ...] = ()
    one_per_gpu: bool = False  # num_processes was not given, so every visible GPU gets a process
    accelerate_notes: tuple[str, ...] = ()  # what each of Accelerate's options became
    replaced: Mapping[str, str] = MappingProxyType({})  # the user's values that env overrides
    keep_awake: bool = False  # macOS: caffeinate holds off idle sleep while the run lasts
    removed: Mapping[str, str] = MappingProxyType({})  # another launcher's, kept from the child
    # The SLURM step this launcher runs in (plan/slurm.py); in rank mode, SLURM started the ranks
    # and this launcher runs one of them, as its one child.
    cluster: Place | None = None

    @property
    def world_size(self) -> int:
        return self.settings.processes * self.settings.num_machines

    @property
    def rank_place(self) -> Place | None:
        """The SLURM step's place in rank mode, else None."""
        return self.cluster if self.cluster is not None and self.cluster.rank_mode else None

    @property
    def rank_mode(self) -> bool:
        return self.rank_place is not None

    @property
    def delivers_signals(self) -> bool:
        """SLURM signals every process of the step itself (plan/slurm.py), so the launcher
        forwards no signal it gets (run/supervisor.py)."""
        return self.cluster is not None and self.cluster.delivers_signals

    @property
    def silent_rank(self) -> bool:
        """Rank mode, not rank 0: rank 0's launcher says the plan, its warnings and its end for
        every task, and this one speaks only of a failure, so a node of 8 tasks prints one plan."""
        place = self.rank_place
        return place is not None and place.rank != 0

    def choice(self) -> str:
        """One line: the device and why, the precision, the processes (and the SLURM step)."""
        count, machines = self.settings.processes, self.settings.num_machines
        processes = f"{count} process" + ("es" if count > 1 else "")
        place = self.rank_place
        if place is not None:
            nodes = place.num_nodes
            processes = (
                f"1 process of {self.world_size}, {place.local_world} on each of "
                f"{nodes} node{'s' if nodes > 1 else ''}"
            )
        elif machines > 1:
            processes += f" on each of {machines} machines"
        if self.one_per_gpu and count > 1:
            processes += ", one per GPU (--num_processes 1 for one)"
        line = f"{self.reason}; precision {self.settings.mixed_precision}; {processes}"
        return line + (f"; {self.cluster.line(self.settings)}" if self.cluster else "")


@record
class LaunchPlan(Decision):
    """A decision, and the command that runs the target with it; made by name only."""

    command: tuple[str, ...] = ()  # what each process runs: python script.py args...
    log_dir: str | None = None
    monitor_interval: float | None = None  # torchrun's --monitor-interval; None: ours
    no_python: bool = False  # command[0] is the target itself
    grace_period: float = DEFAULT_GRACE_SECONDS  # after Ctrl-C or SIGTERM, before the kill
    mps_verdict: str | None = None  # on a Mac: torch's answer about mps, for --dry_run

    def __new__(cls, *, command: tuple[str, ...], **fields: object):
        return super().__new__(cls, command=command, **fields)

    def summary(self) -> str:
        """The one line printed before the child starts."""
        line = f"mpslaunch: {self.choice()}"
        if self.keep_awake:
            line += "; kept awake while it runs"
        if self.log_dir:
            line += f"; output also in {self.log_dir}"
        if self.replaced:
            line += "; replaced in your environment: " + ", ".join(
                f"{key}={old} (now {self.env[key]})" for key, old in sorted(self.replaced.items())
            )
        if self.removed:
            line += f"; removed from the script's environment ({REMOVED_WHY}): " + ", ".join(
                f"{key}={value}" for key, value in sorted(self.removed.items())
            )
        return one_line(line)  # a folder or a value with a newline must not start a line

    def describe(self) -> str:
        """What --dry_run prints: the plan, the command and the variables it adds."""
        settings, place = self.settings, self.rank_place
        lines = [
            f"device:          {self.device} ("
            + ("auto, " if settings.device == "auto" else "")
            + f"{settings.origin('device')})",
            f"reason:          {self.reason}",
            f"mixed precision: {settings.mixed_precision} ({settings.origin('mixed_precision')})",
            *(
                _rank_lines(settings, place)
                if place is not None
                else [
                    f"processes:       {_processes_text(settings, self.one_per_gpu)}",
                    *_machines_lines(settings),
                ]
            ),
            *([f"cluster:         {self.cluster.line(settings)}"] if self.cluster else []),
            f"engine:          {self.engine}",
            *(
                ["keep awake:      caffeinate -i -w <launcher pid> while the run lasts"]
                if self.keep_awake
                else []
            ),
            f"command:         {shell_words(self.command)}",
            "environment added:",
            *(
                f"  {key}={one_line(value)}"
                + (f"   replaced (was {self.replaced[key]})" if key in self.replaced else "")
                for key, value in sorted(self.env.items())
            ),
        ]
        if self.removed:
            lines.append(f"environment removed ({REMOVED_WHY}):")
            lines += [f"  {key}={value}" for key, value in sorted(self.removed.items())]
        if self.log_dir and self.engine == "single":
            lines.append(
                f"output also in:  {self.log_dir}/mpslaunch-<date>-<time>-<pid>/"
                "stdout.log and stderr.log"
            )
        lines += [f"accelerate option {text}" for text in self.accelerate_notes]
        lines += [f"warning: {text}" for text in self.warnings]
        return "\n".join(map(one_line, lines))


def _processes_text(settings: Settings, one_per_gpu: bool) -> str:
    """`2 per machine (--num_processes), 1 machine (default)`: the counts and where they came from."""
    count, machines = settings.processes, settings.num_machines
    each = "one per visible GPU, " if one_per_gpu and count > 1 else ""
    return (
        f"{count} per machine ({each}{settings.origin('num_processes')}), {machines} machine"
        f"{'s' if machines > 1 else ''} ({settings.origin('num_machines')})"
    )


def _machines_lines(settings: Settings) -> list[str]:
    """With several machines: this one's rank, machine 0's address and port, the rendezvous,
    each with where it came from."""
    if settings.num_machines < 2:
        return []
    rank = (
        f"{settings.machine_rank} ({settings.origin('machine_rank')})"
        if settings.rdzv_backend == "static"
        else "given at the rendezvous (c10d)"
    )
    # Port 0 cannot be agreed between machines: torchrun's default is used (run/torchrun).
    port = settings.main_process_port or DEFAULT_PORT
    return [
        f"machine rank:    {rank}",
        f"main address:    {settings.main_process_ip} ({settings.origin('main_process_ip')}), "
        f"port {port} ({settings.origin('main_process_port')})",
        f"rendezvous:      {settings.rdzv_backend} ({settings.origin('rdzv_backend')}), the "
        f"machines wait {settings.rdzv_timeout} s at most ({settings.origin('rdzv_timeout')})",
    ]


def _rank_lines(settings: Settings, place: Place) -> list[str]:
    """Rank mode: SLURM started this task as one rank of the world; where each number came from."""
    return [
        f"processes:       1 in this task ({settings.origin('num_processes')}), one rank of "
        f"{settings.num_machines} tasks ({settings.origin('num_machines')}), "
        f"{place.local_world} on each of {place.num_nodes} nodes",
        f"rank:            {place.rank} ({settings.origin('machine_rank')}), local rank "
        f"{place.local_rank} (SLURM_LOCALID), node {place.node_rank + 1} of {place.num_nodes} "
        f"({place.node})",
        f"main address:    {settings.main_process_ip} ({settings.origin('main_process_ip')}), "
        f"port {settings.main_process_port or DEFAULT_PORT} "
        f"({settings.origin('main_process_port')}), where rank 0 serves the script's store",
    ]


def decide(
    profile: Profile | ProfileFile,
    options: LaunchOptions,
    machine: Machine,
    environ: Mapping[str, str],
) -> Decision:
    """The device, precision, processes and variables for these options over this profile,
    whatever the target: a profile file as read (its values named by its file), or a Profile
    made in Python (its values that differ from the defaults are the profile's)."""
    problem = request_problem(options)
    if problem:
        raise MpslaunchError(problem)
    layer = file_layer(profile) if isinstance(profile, ProfileFile) else profile_layer(profile)
    settings = settle(layer, options_layer(options))
    return decide_settings(settings, options, machine, environ)


def decide_settings(
    settings: Settings,
    options: LaunchOptions,
    machine: Machine,
    environ: Mapping[str, str],
    cluster: Place | None = None,
) -> Decision:
    """decide() for `settings`, what settle() made of the layers (`options` among them);
    `cluster`: where this launcher stands in the SLURM step whose layers were settled."""
    machine = with_gpu_ids(machine, settings, environ)
    device, reason = choose_device(settings, machine)
    rank_place = cluster if cluster is not None and cluster.rank_mode else None
    rank_mode = rank_place is not None
    problem = rank_mode_problem(rank_place, device, machine, environ) if rank_place else None
    if problem:
        raise MpslaunchError(problem)
    one_per_gpu = settings.num_processes is None
    if one_per_gpu:
        settings = settings.replace(num_processes=default_processes(device, machine))
    check_precision(settings, device, machine)
    problem = dynamo_problem(
        settings.dynamo_backend, device, machine, settings.named("dynamo_backend")
    )
    if problem:
        raise MpslaunchError(problem)
    check_processes(settings, device, machine)
    check_multi_gpu(options, settings, device)
    problem = main_address_problem(settings, machine) or own_name_problem(
        settings, device, machine, environ
    )
    if problem:
        raise MpslaunchError(problem)
    multi = settings.processes > 1 or settings.num_machines > 1
    here = rank_place.local_world if rank_place else settings.processes
    env = child_environment(settings, device, machine, environ, multi, here)
    if rank_place:
        env.update(rank_variables(rank_place, settings))
    env.update(accelerate_environment(options, settings, device))
    return Decision(
        device=device,
        reason=reason,
        # rank mode: SLURM started the ranks, and this launcher runs one as its one child
        engine=TORCHRUN if multi and not rank_mode else SINGLE,
        env=env,
        settings=settings,
        warnings=_warnings(settings, device, machine)
        + no_effect(options, settings, device, multi, rank_mode),
        one_per_gpu=one_per_gpu and device == "cuda",
        accelerate_notes=accelerate_notes(options, settings, device, env),
        replaced=replaced_values(env, environ),
        keep_awake=settings.keep_awake and machine.is_mac and machine.caffeinate,
        removed={} if multi else other_launchers_variables(environ),
        cluster=cluster,
    )


def for_target(decision: Decision, request: LaunchRequest, machine: Machine) -> LaunchPlan:
    """The plan that runs the request's target with this decision."""
    if request.no_python and request.module:
        raise MpslaunchError(
            "-m and --no_python cannot be used together: -m runs a module with "
            "python; give one of them"
        )
    decided = decision._asdict()
    if request.no_python:
        decided["accelerate_notes"] += (
            f"--no_python: each process runs {request.target} itself, not with python",
        )
    return LaunchPlan(
        **decided,
        command=child_command(request, machine),
        log_dir=request.log_dir,
        monitor_interval=request.monitor_interval,
        no_python=request.no_python,
        grace_period=request.grace_period,
        mps_verdict=mps_verdict_text(machine) if machine.is_mac else None,
    )


def resolve(
    profile: Profile | ProfileFile,
    request: LaunchRequest,
    machine: Machine,
    environ: Mapping[str, str],
) -> LaunchPlan:
    """decide(), then the command for the request's target."""
    return for_target(decide(profile, request, machine, environ), request, machine)


def mps_verdict_text(machine: Machine) -> str:
    """The dry run's line about torch's verdict on mps."""
    if machine.mps_answer is None:
        return "not asked (only a plan for mps asks torch; `mpslaunch env` asks now)"
    return f"{machine.mps_answer.describe()}; `mpslaunch env` checks again"


# ---------------------------------------------------------------- precedence


def settle(*layers: Layer) -> Settings:
    """The settings from their layers, weakest first, over the defaults (settings.merge: a later
    layer wins; a value that contradicts a cluster's fact is refused); then the rules that tie
    keys together, each value named with where it came from."""
    settings = merge(*layers)
    problem = check_profile(settings)
    if problem:
        raise MpslaunchError(problem)
    return several_machines_settings(settings)


def _warnings(settings: Profile, device: str, machine: Machine) -> tuple[str, ...]:
    found = []
    if device == "cpu" and settings.processes > machine.cpu_count:
        found.append(
            f"{settings.num_processes} processes share {machine.cpu_count} CPU cores; "
            "expect them to be slower than fewer processes"
        )
    if device == "mps" and machine.virtual_machine:
        found.append(
            "mps in a macOS virtual machine is known to fail (allocations refused, "
            "results that differ); --device auto plans cpu here"
        )
    found += warnings_for(
        machine.torch_version,
        machine.chip,
        machine.macos_version,
        settings.mixed_precision,
        device,
        machine.accelerate_version,
    )
    return (*found, *_sleep_warnings(settings, machine))


_SILENCE_SLEEP = "keep_awake: false in the profile (or --no_keep_awake) silences this"


def _sleep_warnings(settings: Profile, machine: Machine) -> tuple[str, ...]:
    """What may pause a run on a Mac (docs/mps-facts.md: Sleep on a Mac)."""
    if not (settings.keep_awake and machine.is_mac):
        return ()
    if not machine.caffeinate:
        return (
            "caffeinate is not on PATH (it is /usr/bin/caffeinate), so nothing keeps this "
            f"Mac awake: it may sleep and pause the run; {_SILENCE_SLEEP}",
        )
    if machine.on_battery:
        return (
            "this Mac runs on its battery: closing the lid sleeps it and pauses the run; "
            + _SILENCE_SLEEP,
        )
    return ()
