"""The rules, as pure functions: `decide(profile, options, machine, environ) -> Decision` (the
device, precision, processes and child variables, for any target), then `for_target(decision,
request, machine) -> LaunchPlan` (the command); `resolve` is the two in one.

Precedence, the device choice, the precision and process checks and the child's environment all
live here; it reads no files and starts nothing, so tests can describe any machine. Each refusal
is an MpslaunchError that says what to do; each rule cites its fact in docs/mps-facts.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from mpslaunch.errors import MpslaunchError
from mpslaunch.machine import Machine, plain_address, version_tuple
from mpslaunch.options import (DEFAULT_GRACE_SECONDS, MPS_WATERMARK_MAX, LaunchOptions,
                               LaunchRequest, request_problem)
from mpslaunch.profile import KNOWN_KEYS, Profile, check_profile

# torch's MPS watermark defaults on unified memory: high 1.7, low 1.4
# (docs/mps-facts.md: Environment variables).
_DEFAULT_HIGH_WATERMARK = 1.7
_DEFAULT_LOW_WATERMARK = 1.4
# Above cores, CPU processes only slow each other down; far above, they exhaust memory.
CPU_PROCESSES_PER_CORE = 4


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
    mps_verdict: str | None = None  # on a Mac: torch's answer about mps, for --dry-run

    def summary(self) -> str:
        """The one line printed before the child starts."""
        line = f"mpslaunch: {self.choice()}"
        if self.log_dir:
            line += f"; output also in {self.log_dir}"
        if self.replaced:
            line += "; replaced in your environment: " + ", ".join(
                f"{key}={old} (now {self.env[key]})" for key, old in sorted(self.replaced.items()))
        return line

    def describe(self) -> str:
        """What --dry-run prints: the plan, the command and the variables it adds."""
        import shlex

        lines = [
            f"device:          {self.device}",
            f"reason:          {self.reason}",
            f"mixed precision: {self.mixed_precision}",
            f"processes:       {self.num_processes} per machine, {self.num_machines} machine(s)"
            + (" (one per visible GPU)" if self.one_per_gpu and self.num_processes > 1 else ""),
            f"engine:          {self.engine}",
            f"command:         {shlex.join(self.command)}",
            "environment added:",
            *(f"  {key}={value}" + (f"   replaced (was {self.replaced[key]})"
                                     if key in self.replaced else "")
              for key, value in sorted(self.env.items())),
        ]
        if self.log_dir and self.engine == "single":
            lines.append(f"output also in:  {self.log_dir}/mpslaunch-<date>-<time>-<pid>/"
                         "stdout.log and stderr.log")
        lines += [f"accelerate option {text}" for text in self.accelerate_notes]
        lines += [f"warning: {text}" for text in self.warnings]
        return "\n".join(lines)


def decide(profile: Profile, options: LaunchOptions, machine: Machine,
           environ: Mapping[str, str]) -> Decision:
    """The device, precision, processes and variables for these options, whatever the target."""
    settings = apply_flags(profile, options)
    machine = with_gpu_ids(machine, settings.gpu_ids, _source(options, "gpu_ids"), environ)
    device, reason = choose_device(settings.device, options, machine)
    one_per_gpu = settings.num_processes is None
    if one_per_gpu:
        settings = settings.replace(num_processes=default_processes(device, machine))
    _check_precision(settings.mixed_precision, device, machine)
    _check_processes(settings, device, machine)
    _check_multi_gpu(options, settings, device)
    problem = main_address_problem(settings, machine)
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
        warnings=_warnings(settings, device, machine) + _no_effect(options, settings, device, multi),
        one_per_gpu=one_per_gpu and device == "cuda",
        accelerate_notes=accelerate_notes(options, settings, device, env),
        replaced=replaced_values(env, environ),
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
    return settings


# ---------------------------------------------------------------- device


def choose_device(wanted: str, options: LaunchOptions, machine: Machine) -> tuple[str, str]:
    """The device and a one-line reason. Explicit requests never fall back silently."""
    source = "--cpu" if options.cpu else (f"--device {options.device}" if options.device else "the profile")
    if wanted == "cpu":
        return "cpu", f"cpu: asked for by {source}"
    if wanted in ("mps", "cuda"):
        problem = mps_problem(machine) if wanted == "mps" else cuda_problem(machine)
        if problem:
            raise MpslaunchError(f"{source} asks for {wanted}, but {problem}; "
                                 "use --device auto to pick what this machine has, or --cpu")
        return wanted, _describe(wanted, machine)
    # In a VM, say so before torch's verdict: a small check can pass there and training fail.
    mps_auto_problem = (platform_mps_problem(machine) or virtual_machine_problem(machine)
                        or torch_mps_problem(machine))
    for device, problem in (("mps", mps_auto_problem), ("cuda", cuda_problem(machine))):
        if problem is None:
            return device, _describe(device, machine)
    why = mps_auto_problem if machine.is_mac else cuda_problem(machine)
    return "cpu", f"cpu: {why}"


def mps_minimum_macos(torch_version: str) -> tuple[int, ...]:
    """The oldest macOS whose MPS backend this torch supports (docs/mps-facts.md: Detecting MPS)."""
    release = version_tuple(torch_version)[:2]
    if release >= (2, 9):
        return (14, 0)  # macOS 13 support dropped in 2.9 (pytorch PR #162921)
    if release >= (2, 5):
        return (13, 0)  # macOS 12 dropped in 2.5 (pytorch PR #133141)
    return (12, 3)


def mps_problem(machine: Machine) -> str | None:
    """Why mps cannot be used here, or None when it can."""
    return platform_mps_problem(machine) or torch_mps_problem(machine)


def platform_mps_problem(machine: Machine) -> str | None:
    """Why the platform facts alone rule mps out, or None."""
    if not machine.is_mac:
        return f"mps needs a Mac with Apple silicon and this is {machine.system} {machine.arch}"
    if machine.rosetta:
        # An x86_64 Python under Rosetta has no MPS (docs/mps-facts.md: Detecting MPS).
        return ("this Python is an x86_64 build running under Rosetta, which has no mps; "
                "install an arm64 Python (python.org, Homebrew in /opt/homebrew, or conda "
                "osx-arm64) and torch inside it")
    if machine.arch != "arm64":
        # The last x86_64 macOS wheels are torch 2.2 (docs/mps-facts.md: Detecting MPS).
        return "this is an Intel Mac; mps training needs Apple silicon"
    if not machine.torch_version:
        return f"torch is not installed for {machine.python}; run `pip install torch`"
    needed = mps_minimum_macos(machine.torch_version)
    if machine.macos_version and machine.macos_version < needed:
        return (f"torch {machine.torch_version} needs macOS {'.'.join(map(str, needed))} or later "
                f"for mps and this Mac runs macOS {machine.macos_text}; update macOS, or install "
                f"{_older_torch_for(machine.macos_version)}")
    return None


def torch_mps_problem(machine: Machine) -> str | None:
    """torch's own verdict, from a child (docs/mps-facts.md: Detecting MPS): it sees what no
    version rule predicts, such as a macOS 26 release that torch does not take yet."""
    answer = machine.mps_answer
    if machine.is_mac and answer is not None and not answer.usable:
        return (f"torch {machine.torch_version} cannot use mps on this Mac: {answer.detail} "
                f"(checked {answer.checked_at}); {answer.fix}")
    return None


def virtual_machine_problem(machine: Machine) -> str | None:
    """Why auto avoids mps in a macOS virtual machine, where torch says yes and allocations then
    fail (docs/mps-facts.md: Where torch's own answer and the platform disagree)."""
    if machine.is_mac and machine.virtual_machine:
        return ("this Mac is a virtual machine (kern.hv_vmm_present=1), where mps is "
                "paravirtualised and known to fail (GitHub's macOS runners are such machines); "
                "--device mps tries it anyway")
    return None


def _older_torch_for(macos: tuple[int, ...]) -> str:
    if macos >= (13, 0):
        return "'torch<2.9' (the last releases for macOS 13)"
    return "'torch<2.5' (the last releases for macOS 12.3)"


def cuda_problem(machine: Machine) -> str | None:
    """Why cuda cannot be used here, or None when it can."""
    if not machine.cuda_devices:
        return "no NVIDIA GPU is visible" + (" (this is a Mac)" if machine.is_mac else "")
    if not machine.torch_version:
        return f"torch is not installed for {machine.python}; run `pip install torch`"
    if not machine.torch_cuda:
        return (f"torch {machine.torch_version} is a CPU-only build; install a CUDA build of "
                "torch (see pytorch.org's install selector)")
    return None


def _describe(device: str, machine: Machine) -> str:
    if device == "mps":
        return f"mps: {machine.chip or 'Apple silicon'}, macOS {machine.macos_text}, torch {machine.torch_version}"
    count = len(machine.cuda_devices)
    names = ", ".join(sorted(set(machine.cuda_devices)))
    return f"cuda: {count} x {names}, torch {machine.torch_version} (CUDA {machine.torch_cuda})"


# ---------------------------------------------------------------- precision


def _check_precision(precision: str, device: str, machine: Machine) -> None:
    problem = precision_problem(precision, device, machine)
    if problem:
        raise MpslaunchError(problem)


def precision_problem(precision: str, device: str, machine: Machine) -> str | None:
    """Why this precision cannot run on this device, with what to use instead; or None."""
    refusal = precision_refusal(precision, device, machine)
    return "; ".join(refusal) if refusal else None


def precision_refusal(precision: str, device: str, machine: Machine) -> tuple[str, str] | None:
    """(why this precision cannot run on this device, the command-line flags to use instead), or
    None. The questionnaire and bench show the reason with advice of their own."""
    torch_release = version_tuple(machine.torch_version)
    if precision == "fp16" and device == "cpu":
        # Accelerate turns fp16 on cpu into plain fp32 without a word; we say so instead.
        return ("fp16 mixed precision does not run on cpu (Accelerate would silently train in "
                "fp32)", "use --mixed_precision bf16 on cpu, or no")
    if precision == "fp16" and device == "mps" and torch_release < (2, 8):
        # GradScaler works on mps from torch 2.8 (docs/mps-facts.md: Precision).
        return (f"fp16 training on mps needs torch 2.8 or later (GradScaler on mps), this is "
                f"torch {machine.torch_version}", "upgrade torch, or use --mixed_precision no")
    if precision == "bf16" and device == "mps":
        if machine.macos_version and machine.macos_version < (14, 0):
            # bfloat16 on MPS needs macOS 14 (docs/mps-facts.md: Precision).
            return (f"bf16 on mps needs macOS 14 or later and this Mac runs macOS "
                    f"{machine.macos_text}", "use --mixed_precision fp16 (torch 2.8 or later) or no")
        if torch_release < (2, 6):
            # bf16 autocast on mps needs torch 2.6 (docs/mps-facts.md: Precision).
            return (f"bf16 on mps needs torch 2.6 or later, this is torch {machine.torch_version}",
                    "upgrade torch, or use --mixed_precision no")
    return None


# ---------------------------------------------------------------- processes


def default_processes(device: str, machine: Machine) -> int:
    """Processes per machine when neither flag nor profile says: one per visible GPU on cuda
    (as `accelerate launch` does without a config), one on mps and cpu."""
    return max(1, len(machine.cuda_devices)) if device == "cuda" else 1


def _check_processes(settings: Profile, device: str, machine: Machine) -> None:
    problem = processes_problem(settings, device, machine)
    if problem:
        raise MpslaunchError(problem)


def processes_problem(settings: Profile, device: str, machine: Machine) -> str | None:
    """Why this many processes and machines cannot run on this device here, or None."""
    if device == "mps" and (settings.num_processes > 1 or settings.num_machines > 1):
        # gloo and nccl do not work with mps tensors (docs/mps-facts.md: Training on a Mac).
        asked = (f"{settings.num_processes} processes" if settings.num_processes > 1
                 else f"{settings.num_machines} machines")
        return (
            f"{asked} cannot train on mps: only one process can use a Mac's GPU, and the "
            "distributed backends (gloo, nccl) do not work with mps tensors; run one mps process "
            f"(--num_processes 1), or use --cpu --num_processes {max(settings.num_processes, 2)} "
            "for several CPU processes, or a machine with several NVIDIA GPUs")
    most_cpu_processes = most_processes("cpu", machine)
    if device == "cpu" and settings.num_processes > most_cpu_processes:
        return (
            f"--num_processes {settings.num_processes} CPU processes on {machine.cpu_count} cores "
            f"would thrash the machine (each process holds a model copy); use at most "
            f"{most_cpu_processes}, usually no more than {machine.cpu_count}")
    gpus = len(machine.cuda_devices)
    if device == "cuda" and settings.num_processes > gpus:
        return (
            f"--num_processes {settings.num_processes} runs one process per GPU, but "
            f"{gpus} NVIDIA GPU{'s are' if gpus != 1 else ' is'} visible; use --num_processes "
            f"{gpus} or fewer")
    return None


def most_processes(device: str, machine: Machine) -> int:
    """The most processes per machine this device allows here: one on mps, one per visible GPU on
    cuda, CPU_PROCESSES_PER_CORE per core on cpu."""
    if device == "mps":
        return 1
    if device == "cuda":
        return len(machine.cuda_devices)
    return CPU_PROCESSES_PER_CORE * machine.cpu_count


# ---------------------------------------------------------------- several machines


def checks_main_address(settings: Profile) -> bool:
    """Machine 0 of several serves the rendezvous on the main address, so that address must be
    one of its own; unless the user says it reaches machine 0 through NAT."""
    return (settings.num_machines > 1 and settings.machine_rank == 0
            and not settings.main_process_ip_via_nat)


def main_address_problem(settings: Profile, machine: Machine) -> str | None:
    """Why machine 0 cannot serve on main_process_ip, or None. Unchecked (None) when the
    machine's addresses were not probed."""
    if not checks_main_address(settings) or machine.addresses is None:
        return None
    address = settings.main_process_ip
    literal = plain_address(address)
    if literal:
        stands_for: tuple[str, ...] = (literal,)
    elif machine.name_lookup and machine.name_lookup[0] == address:
        stands_for = machine.name_lookup[1]
    else:
        return None  # a host name that was not looked up
    if set(stands_for) & set(machine.addresses):
        return None
    what = "does not resolve to any address" if not stands_for else "is not an address of this machine"
    own = [ip for ip in machine.addresses if not ip.startswith(("127.", "::1", "fe80:"))]
    return (f"main_process_ip {address} {what}, and machine 0 serves the rendezvous there; give "
            f"one of this machine's addresses ({', '.join(own[:5]) or 'none but the loopback'}), "
            "give this machine its own --machine_rank if it is not machine 0, or add "
            "--main_process_ip_via_nat if that address reaches this machine through NAT")


def _warnings(settings: Profile, device: str, machine: Machine) -> tuple[str, ...]:
    if device == "cpu" and settings.num_processes > machine.cpu_count:
        return (f"{settings.num_processes} processes share {machine.cpu_count} CPU cores; "
                "expect them to be slower than fewer processes",)
    if device == "mps" and machine.virtual_machine:
        return ("mps in a macOS virtual machine is known to fail (allocations refused, results "
                "that differ); --device auto plans cpu here",)
    return ()


# ---------------------------------------------------------------- the child


def child_command(request: LaunchRequest, machine: Machine) -> tuple[str, ...]:
    if request.no_python:
        return (request.target, *request.target_args)
    entry = ("-m", request.target) if request.module else (request.target,)
    return (machine.python, *entry, *request.target_args)


def child_environment(settings: Profile, device: str, machine: Machine,
                      environ: Mapping[str, str], multi: bool) -> dict[str, str]:
    """Variables the child gets on top of the user's environment (the README's table)."""
    env = {
        "MPSLAUNCH_DEVICE": device,
        "MPSLAUNCH_MIXED_PRECISION": settings.mixed_precision,
        "MPSLAUNCH_NUM_PROCESSES": str(settings.num_processes * settings.num_machines),
        # What an unmodified Accelerator() reads
        # (docs/mps-facts.md: How Accelerate passes a plan to a script).
        "ACCELERATE_USE_CPU": "true" if device == "cpu" else "false",
        "ACCELERATE_MIXED_PRECISION": settings.mixed_precision,
    }
    if not multi and device != "cpu":
        # PartialState takes this device as given, so the script cannot silently land on cpu.
        # Not with several processes: it would put every rank on the same GPU.
        env["ACCELERATE_TORCH_DEVICE"] = device
    if device == "mps":
        env.update(mps_environment(settings, environ))
    if settings.num_processes > 1 and "OMP_NUM_THREADS" not in environ:
        # Several CPU processes each starting one thread per core oversubscribe the machine, so
        # they share the cores; GPU ranks get torchrun's own default, one thread.
        env["OMP_NUM_THREADS"] = (str(max(1, machine.cpu_count // settings.num_processes))
                                  if device == "cpu" else "1")
    return env


def replaced_values(env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The user's own values that the plan overrides, to be named (never replaced silently).

    The variables the plan sets carry its decisions, and the plan comes from flags, then the
    profile, then auto-detection: an exported ACCELERATE_MIXED_PRECISION is none of those, so
    it does not win (it would also skip the checks, such as fp16 refused on cpu). Variables the
    plan only defaults (OMP_NUM_THREADS, PYTORCH_ENABLE_MPS_FALLBACK) are not set when the user
    has them, so they never appear here.
    """
    return {key: environ[key] for key, value in env.items() if environ.get(key, value) != value}


def mps_environment(settings: Profile, environ: Mapping[str, str]) -> dict[str, str]:
    env = {}
    # Read once when torch loads, so it must be set before the child starts
    # (docs/mps-facts.md: Environment variables).
    if "PYTORCH_ENABLE_MPS_FALLBACK" not in environ:
        env["PYTORCH_ENABLE_MPS_FALLBACK"] = "1" if settings.mps_fallback else "0"
    high_text = environ.get("PYTORCH_MPS_HIGH_WATERMARK_RATIO")
    if high_text is None and settings.mps_memory_cap is not None:
        high_text = env["PYTORCH_MPS_HIGH_WATERMARK_RATIO"] = _ratio_text(settings.mps_memory_cap)
    if high_text is not None:
        env.update(_low_watermark(_parse_ratio("PYTORCH_MPS_HIGH_WATERMARK_RATIO", high_text), environ))
    return env


def _low_watermark(high: float, environ: Mapping[str, str]) -> dict[str, str]:
    """Keep low <= high: torch refuses to start the allocator otherwise ('invalid low watermark')."""
    limit = high if high > 0 else MPS_WATERMARK_MAX  # 0.0: no limit; torch allows a low up to 2.0
    low_text = environ.get("PYTORCH_MPS_LOW_WATERMARK_RATIO")
    if low_text is not None:
        low = _parse_ratio("PYTORCH_MPS_LOW_WATERMARK_RATIO", low_text)
        if low > limit:
            raise MpslaunchError(
                f"PYTORCH_MPS_LOW_WATERMARK_RATIO={low_text} is above the high watermark {high}, "
                "which torch refuses at start; lower it or unset it and mpslaunch picks one")
        return {}
    if _DEFAULT_LOW_WATERMARK <= limit:
        return {}
    # Keep torch's default proportion between the soft (low) and hard (high) limits.
    scaled = high * _DEFAULT_LOW_WATERMARK / _DEFAULT_HIGH_WATERMARK
    return {"PYTORCH_MPS_LOW_WATERMARK_RATIO": _ratio_text(scaled)}


def _parse_ratio(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= MPS_WATERMARK_MAX:
        raise MpslaunchError(f"{name}={text!r} must be a number from 0.0 to "
                             f"{MPS_WATERMARK_MAX}; fix or unset it")
    return value


def _ratio_text(value: float) -> str:
    return f"{value:.4f}".rstrip("0").rstrip(".") if value else "0.0"


# ---------------------------------------------------------------- Accelerate's launch options


def _source(options: LaunchOptions, key: str) -> str:
    """How a message names a setting: the flag when it was given, else the profile's key."""
    return f"--{key}" if getattr(options, key, None) not in (None, False) else f"the profile's {key}"


def with_gpu_ids(machine: Machine, gpu_ids: str | None, source: str,
                 environ: Mapping[str, str]) -> Machine:
    """The machine as the ranks will see it with CUDA_VISIBLE_DEVICES=gpu_ids (Accelerate's
    meaning: driver numbers). Without NVIDIA GPUs it changes nothing (a warning says so)."""
    if gpu_ids in (None, "all") or not machine.cuda_devices:
        return machine
    if "CUDA_VISIBLE_DEVICES" in environ:
        raise MpslaunchError(f"{source} {gpu_ids} and CUDA_VISIBLE_DEVICES="
                             f"{environ['CUDA_VISIBLE_DEVICES']} both choose GPUs; unset one of them")
    ids = [int(part) for part in gpu_ids.split(",")]
    count = len(machine.cuda_devices)
    if max(ids) >= count or len(set(ids)) != len(ids):
        raise MpslaunchError(f"{source} {gpu_ids} names GPUs this machine does not have, or one "
                             f"twice: {count} NVIDIA GPU{'s are' if count != 1 else ' is'} visible "
                             f"(numbers 0 to {count - 1})")
    return replace(machine, cuda_devices=tuple(machine.cuda_devices[i] for i in ids))


def _check_multi_gpu(options: LaunchOptions, settings: Profile, device: str) -> None:
    world = settings.num_processes * settings.num_machines
    if options.multi_gpu and not (device == "cuda" and world > 1):
        raise MpslaunchError(
            f"--multi_gpu asks for several GPUs, but the plan is {world} process"
            f"{'es' if world > 1 else ''} on {device}; mpslaunch starts one process per visible "
            "NVIDIA GPU without it, so drop --multi_gpu, or what asks for one process")


def accelerate_environment(request: LaunchOptions, settings: Profile, device: str) -> dict[str, str]:
    """The variables `accelerate launch` sets for these options (accelerate/utils/launch.py)."""
    env = {}
    if device == "cuda" and settings.gpu_ids not in (None, "all"):
        env["CUDA_VISIBLE_DEVICES"] = settings.gpu_ids
    if request.num_cpu_threads_per_process is not None:
        env["OMP_NUM_THREADS"] = str(request.num_cpu_threads_per_process)
    if settings.dynamo_backend != "no":
        env.update({
            "ACCELERATE_DYNAMO_BACKEND": settings.dynamo_backend.upper(),
            "ACCELERATE_DYNAMO_MODE": settings.dynamo_mode,
            "ACCELERATE_DYNAMO_USE_FULLGRAPH": str(settings.dynamo_use_fullgraph),
            "ACCELERATE_DYNAMO_USE_DYNAMIC": str(settings.dynamo_use_dynamic),
            "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": str(settings.dynamo_use_regional_compilation),
        })
    if settings.debug:
        env["ACCELERATE_DEBUG_MODE"] = "true"
    return env


def accelerate_notes(request: LaunchOptions, settings: Profile, device: str,
                     env: Mapping[str, str]) -> tuple[str, ...]:
    """For --dry-run: what each of Accelerate's options given became."""
    notes = []
    if request.multi_gpu:
        notes.append(f"--multi_gpu: checked: {settings.num_processes} processes, one per GPU")
    if "CUDA_VISIBLE_DEVICES" in env:
        notes.append(f"{_source(request, 'gpu_ids')} {settings.gpu_ids}: CUDA_VISIBLE_DEVICES="
                     f"{env['CUDA_VISIBLE_DEVICES']} for the ranks, and only these GPUs count")
    if request.num_cpu_threads_per_process is not None:
        notes.append(f"--num_cpu_threads_per_process {request.num_cpu_threads_per_process}: "
                     f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}")
    if "ACCELERATE_DYNAMO_BACKEND" in env:
        dynamo = " ".join(f"{key}={value}" for key, value in env.items() if "_DYNAMO_" in key)
        notes.append(f"{_source(request, 'dynamo_backend')} {settings.dynamo_backend}: {dynamo}")
    if settings.debug:
        notes.append(f"{_source(request, 'debug')}: ACCELERATE_DEBUG_MODE=true")
    if request.tee is not None:
        notes.append(f"--tee {request.tee}: every rank's output always reaches the console "
                     "(prefixed [rankN]), and with --log_dir also its files")
    if request.monitor_interval is not None:
        notes.append(f"--monitor_interval {request.monitor_interval:g}: torch.distributed.run's "
                     "--monitor-interval")
    return tuple(notes)


# What only torch.distributed.run uses: nothing to do with one process.
SEVERAL_PROCESS_OPTIONS = ("max_restarts", "rdzv_backend", "main_process_ip", "main_process_port",
                           "machine_rank", "monitor_interval")


def _no_effect(request: LaunchOptions, settings: Profile, device: str, multi: bool) -> tuple[str, ...]:
    """Options given that change nothing in this plan, named rather than silently dropped."""
    warnings = []
    if settings.gpu_ids not in (None, "all") and device != "cuda":
        warnings.append(f"{_source(request, 'gpu_ids')} {settings.gpu_ids} has no effect on {device}")
    idle = [f"--{key}" for key in SEVERAL_PROCESS_OPTIONS if getattr(request, key) is not None]
    if idle and not multi:
        warnings.append(f"{', '.join(idle)} {'has' if len(idle) == 1 else 'have'} no effect with "
                        "one process")
    if request.num_processes is not None and settings.num_machines > 1:
        # Accelerate's --num_processes counts every machine's processes; an Accelerate habit here
        # would start num_machines times too many.
        total = request.num_processes * settings.num_machines
        warnings.append(f"--num_processes {request.num_processes} counts this machine's processes "
                        f"(Accelerate's counts every machine's): {total} in all")
    return tuple(warnings)

