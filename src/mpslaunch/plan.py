"""The rules: `resolve(profile, request, machine, environ) -> LaunchPlan`, a pure function.

Everything mpslaunch decides lives here: precedence (flag > profile > auto-detection), the device
choice, mixed-precision checks, the multi-process rules and the child's environment. It reads no
files and starts nothing, so tests can describe any machine (an M1 on macOS 13, a Rosetta Python,
Linux with 8 GPUs) and check the plan. Every refusal is an MpslaunchError whose message says what
to do. The facts behind each rule are in shared/MPS-FACTS.md; the comment beside a rule cites it.
"""

from __future__ import annotations

from collections.abc import Mapping  # typing costs an import on every launch
from dataclasses import dataclass, field, fields

from mpslaunch.errors import MpslaunchError
from mpslaunch.machine import Machine, version_tuple
from mpslaunch.profile import KNOWN_KEYS, Profile, check_profile, check_value

# torch's MPS watermark defaults on unified memory (MPSAllocator.mm): high 1.7, low 1.4.
_DEFAULT_HIGH_WATERMARK = 1.7
_DEFAULT_LOW_WATERMARK = 1.4
_WATERMARK_UPPER_BOUND = 2.0  # what torch allows when the high ratio is 0.0 ("no limit")
# Above cores, CPU processes only slow each other down; far above, they exhaust memory.
CPU_PROCESSES_PER_CORE = 4


@dataclass(frozen=True)
class LaunchRequest:
    """What the command line asked for. None means "not given": the profile decides."""

    target: str  # a script path, or a module name when `module` is set
    target_args: tuple[str, ...] = ()
    module: bool = False
    cpu: bool = False
    device: str | None = None
    mixed_precision: str | None = None
    num_processes: int | None = None
    num_machines: int | None = None
    machine_rank: int | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = None
    max_restarts: int | None = None
    log_dir: str | None = None


@dataclass(frozen=True)
class LaunchPlan:
    device: str  # "mps", "cuda" or "cpu"
    reason: str  # one line: why this device
    mixed_precision: str
    num_processes: int  # processes on this machine
    num_machines: int
    engine: str  # "single": one child process; "torchrun": torch.distributed.run
    command: tuple[str, ...]  # what each process runs: python script.py args...
    env: Mapping[str, str]  # variables added to (or changed in) the user's environment
    settings: Profile  # the profile after the command-line flags were applied
    log_dir: str | None = None
    warnings: tuple[str, ...] = field(default=())
    one_per_gpu: bool = False  # num_processes was not given, so every visible GPU gets a process

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_machines

    def processes_text(self) -> str:
        """'2 processes, one per GPU (--num_processes 1 for one)', '1 process', ..."""
        text = f"{self.num_processes} process" + ("es" if self.num_processes > 1 else "")
        if self.num_machines > 1:
            text += f" on each of {self.num_machines} machines"
        if self.one_per_gpu and self.num_processes > 1:
            text += ", one per GPU (--num_processes 1 for one)"
        return text

    def summary(self) -> str:
        """The one line printed before the child starts."""
        return f"mpslaunch: {self.reason}; precision {self.mixed_precision}; {self.processes_text()}"

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
            *(f"  {key}={value}" for key, value in sorted(self.env.items())),
        ]
        lines += [f"warning: {text}" for text in self.warnings]
        return "\n".join(lines)


def resolve(profile: Profile, request: LaunchRequest, machine: Machine,
            environ: Mapping[str, str]) -> LaunchPlan:
    settings = apply_flags(profile, request)
    device, reason = choose_device(settings.device, request, machine)
    one_per_gpu = settings.num_processes is None
    if one_per_gpu:
        settings = settings.replace(num_processes=default_processes(device, machine))
    _check_precision(settings.mixed_precision, device, machine)
    _check_processes(settings, device, machine)
    multi = settings.num_processes > 1 or settings.num_machines > 1
    return LaunchPlan(
        device=device,
        reason=reason,
        mixed_precision=settings.mixed_precision,
        num_processes=settings.num_processes,
        num_machines=settings.num_machines,
        engine="torchrun" if multi else "single",
        command=child_command(request, machine),
        env=child_environment(settings, device, machine, environ, multi),
        settings=settings,
        log_dir=request.log_dir,
        warnings=_warnings(settings, device, machine),
        one_per_gpu=one_per_gpu and device == "cuda",
    )


# ---------------------------------------------------------------- precedence


def apply_flags(profile: Profile, request: LaunchRequest) -> Profile:
    """Command-line flags win over the profile; each flag is checked like a profile key."""
    if request.cpu and request.device not in (None, "cpu"):
        raise MpslaunchError(f"--cpu and --device {request.device} contradict each other; give one")
    changes = {}
    for key in KNOWN_KEYS:
        value = getattr(request, key, None)
        if value is None or key == "version":
            continue
        problem = check_value(key, value)
        if problem:
            raise MpslaunchError(f"--{key} {problem}")
        changes[key] = value
    if request.cpu:
        changes["device"] = "cpu"
    settings = profile.replace(**changes)
    problem = check_profile(settings)
    if problem:
        raise MpslaunchError(problem)
    return settings


# ---------------------------------------------------------------- device


def choose_device(wanted: str, request: LaunchRequest, machine: Machine) -> tuple[str, str]:
    """The device and a one-line reason. Explicit requests never fall back silently."""
    source = "--cpu" if request.cpu else (f"--device {request.device}" if request.device else "the profile")
    if wanted == "cpu":
        return "cpu", f"cpu: asked for by {source}"
    if wanted in ("mps", "cuda"):
        problem = mps_problem(machine) if wanted == "mps" else cuda_problem(machine)
        if problem:
            raise MpslaunchError(f"{source} asks for {wanted}, but {problem}; "
                                 "use --device auto to pick what this machine has, or --cpu")
        return wanted, _describe(wanted, machine)
    for device, problem in (("mps", mps_problem(machine)), ("cuda", cuda_problem(machine))):
        if problem is None:
            return device, _describe(device, machine)
    why = mps_problem(machine) if machine.is_mac else cuda_problem(machine)
    return "cpu", f"cpu: {why}"


def mps_minimum_macos(torch_version: str) -> tuple[int, ...]:
    """The oldest macOS whose MPS backend this torch supports (MPS-FACTS: Detecting MPS)."""
    release = version_tuple(torch_version)[:2]
    if release >= (2, 9):
        return (14, 0)  # macOS 13 support dropped in 2.9 (pytorch PR #162921)
    if release >= (2, 5):
        return (13, 0)  # macOS 12 dropped in 2.5 (pytorch PR #133141)
    return (12, 3)


def mps_problem(machine: Machine) -> str | None:
    """Why mps cannot be used here, or None when it can."""
    if not machine.is_mac:
        return f"mps needs a Mac with Apple silicon and this is {machine.system} {machine.arch}"
    if machine.rosetta:
        # An x86_64 Python under Rosetta reports x86_64 and has no MPS (MPS-FACTS: Rosetta).
        return ("this Python is an x86_64 build running under Rosetta, which has no mps; "
                "install an arm64 Python (python.org, Homebrew in /opt/homebrew, or conda "
                "osx-arm64) and torch inside it")
    if machine.arch != "arm64":
        # The last x86_64 macOS wheels are torch 2.2 (pytorch #114602).
        return "this is an Intel Mac; mps training needs Apple silicon"
    if not machine.torch_version:
        return f"torch is not installed for {machine.python}; run `pip install torch`"
    needed = mps_minimum_macos(machine.torch_version)
    if machine.macos_version and machine.macos_version < needed:
        return (f"torch {machine.torch_version} needs macOS {'.'.join(map(str, needed))} or later "
                f"for mps and this Mac runs macOS {machine.macos_text}; update macOS, or install "
                f"{_older_torch_for(machine.macos_version)}")
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
    torch_release = version_tuple(machine.torch_version)
    if precision == "fp16" and device == "cpu":
        # Accelerate turns fp16 on cpu into plain fp32 without a word; we say so instead.
        return ("fp16 mixed precision does not run on cpu (Accelerate would silently train in "
                "fp32); use --mixed_precision bf16 on cpu, or no")
    if precision == "fp16" and device == "mps" and torch_release < (2, 8):
        # GradScaler works on mps from torch 2.8 (pytorch PR #150255); before, unscale_ fails.
        return (f"fp16 training on mps needs torch 2.8 or later (GradScaler on mps), this is "
                f"torch {machine.torch_version}; upgrade torch, or use --mixed_precision no")
    if precision == "bf16" and device == "mps":
        if machine.macos_version and machine.macos_version < (14, 0):
            # bfloat16 on MPS needs macOS 14 (torch.backends.mps.is_macos_or_newer(14, 0)).
            return (f"bf16 on mps needs macOS 14 or later and this Mac runs macOS "
                    f"{machine.macos_text}; use --mixed_precision fp16 (torch 2.8 or later) or no")
        if torch_release < (2, 6):
            # bf16 autocast on mps arrived in torch 2.6 (Accelerate refuses it below).
            return (f"bf16 on mps needs torch 2.6 or later, this is torch "
                    f"{machine.torch_version}; upgrade torch, or use --mixed_precision no")
    return None


# ---------------------------------------------------------------- processes


def default_processes(device: str, machine: Machine) -> int:
    """Processes per machine when neither flag nor profile says: one per visible GPU on cuda
    (as `accelerate launch` does without a config), one on mps and cpu."""
    return max(1, len(machine.cuda_devices)) if device == "cuda" else 1


def _check_processes(settings: Profile, device: str, machine: Machine) -> None:
    if device == "mps" and (settings.num_processes > 1 or settings.num_machines > 1):
        # gloo and nccl do not work with mps tensors (MPS-FACTS: Training on a Mac).
        asked = (f"{settings.num_processes} processes" if settings.num_processes > 1
                 else f"{settings.num_machines} machines")
        raise MpslaunchError(
            f"{asked} cannot train on mps: only one process can use a Mac's GPU, and the "
            "distributed backends (gloo, nccl) do not work with mps tensors; run one mps process "
            f"(--num_processes 1), or use --cpu --num_processes {max(settings.num_processes, 2)} "
            "for several CPU processes, or a machine with several NVIDIA GPUs")
    most_cpu_processes = CPU_PROCESSES_PER_CORE * machine.cpu_count
    if device == "cpu" and settings.num_processes > most_cpu_processes:
        raise MpslaunchError(
            f"--num_processes {settings.num_processes} CPU processes on {machine.cpu_count} cores "
            f"would thrash the machine (each process holds a model copy); use at most "
            f"{most_cpu_processes}, usually no more than {machine.cpu_count}")
    gpus = len(machine.cuda_devices)
    if device == "cuda" and settings.num_processes > gpus:
        raise MpslaunchError(
            f"--num_processes {settings.num_processes} runs one process per GPU, but "
            f"{gpus} NVIDIA GPU{'s are' if gpus != 1 else ' is'} visible; use --num_processes "
            f"{gpus} or fewer")


def _warnings(settings: Profile, device: str, machine: Machine) -> tuple[str, ...]:
    if device == "cpu" and settings.num_processes > machine.cpu_count:
        return (f"{settings.num_processes} processes share {machine.cpu_count} CPU cores; "
                "expect them to be slower than fewer processes",)
    return ()


# ---------------------------------------------------------------- the child


def child_command(request: LaunchRequest, machine: Machine) -> tuple[str, ...]:
    entry = ("-m", request.target) if request.module else (request.target,)
    return (machine.python, *entry, *request.target_args)


def child_environment(settings: Profile, device: str, machine: Machine,
                      environ: Mapping[str, str], multi: bool) -> dict[str, str]:
    """Variables the child gets on top of the user's environment (the README's table)."""
    env = {
        "MPSLAUNCH_DEVICE": device,
        "MPSLAUNCH_MIXED_PRECISION": settings.mixed_precision,
        "MPSLAUNCH_NUM_PROCESSES": str(settings.num_processes * settings.num_machines),
        # What an unmodified Accelerator() reads (accelerate/state.py).
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


def mps_environment(settings: Profile, environ: Mapping[str, str]) -> dict[str, str]:
    env = {}
    # Read once when torch loads (MPSFallback.mm), so it must be set before the child starts.
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
    limit = high if high > 0 else _WATERMARK_UPPER_BOUND
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
    if not 0.0 <= value <= _WATERMARK_UPPER_BOUND:
        raise MpslaunchError(f"{name}={text!r} must be a number from 0.0 to "
                             f"{_WATERMARK_UPPER_BOUND}; fix or unset it")
    return value


def _ratio_text(value: float) -> str:
    return f"{value:.4f}".rstrip("0").rstrip(".") if value else "0.0"


assert {f.name for f in fields(LaunchRequest)} >= set(KNOWN_KEYS) - {"version", "mps_fallback", "mps_memory_cap"}
