"""What the child gets: its command, the variables it gets on top of the user's environment (the
README's table), what is kept from it (another launcher's variables: environment.py), and the
variables and notes for Accelerate's own launch options. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from mpslaunch.machine import Machine
from mpslaunch.output import MpslaunchError
from mpslaunch.plan.environment import is_other_launchers_variable
from mpslaunch.settings import MPS_WATERMARK_MAX, LaunchOptions, LaunchRequest, Profile, Settings

# torch's MPS watermark defaults on unified memory: high 1.7, low 1.4
# (docs/mps-facts.md: Environment variables).
_DEFAULT_HIGH_WATERMARK = 1.7
_DEFAULT_LOW_WATERMARK = 1.4


def child_command(request: LaunchRequest, machine: Machine) -> tuple[str, ...]:
    if request.no_python:
        return (request.target, *request.target_args)
    entry = ("-m", request.target) if request.module else (_as_file(request.target),)
    return (machine.python, *entry, *request.target_args)


def _as_file(script: str) -> str:
    """A script named like an option (`-dash.py`) as a path Python and torchrun take as a file."""
    return f"./{script}" if script.startswith("-") else script


def child_environment(
    settings: Profile,
    device: str,
    machine: Machine,
    environ: Mapping[str, str],
    multi: bool,
    here: int | None = None,
) -> dict[str, str]:
    """Variables the child gets on top of the user's environment (the README's table). `here`:
    the processes that share this machine (num_processes; SLURM's tasks on it in rank mode)."""
    here = settings.processes if here is None else here
    env = {
        "MPSLAUNCH_DEVICE": device,
        "MPSLAUNCH_MIXED_PRECISION": settings.mixed_precision,
        "MPSLAUNCH_NUM_PROCESSES": str(settings.processes * settings.num_machines),
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
    if "PYTHONFAULTHANDLER" not in environ:
        # A crash in native code (a segfault, an abort in a kernel) then prints the Python stack.
        env["PYTHONFAULTHANDLER"] = "1"
    if here > 1 and "OMP_NUM_THREADS" not in environ:
        # Several CPU processes each starting one thread per core oversubscribe the machine, so
        # they share the cores; GPU ranks get torchrun's own default, one thread.
        env["OMP_NUM_THREADS"] = str(max(1, machine.cpu_count // here)) if device == "cpu" else "1"
    return env


def other_launchers_variables(environ: Mapping[str, str]) -> dict[str, str]:
    return {key: value for key, value in environ.items() if is_other_launchers_variable(key)}


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
        env.update(
            _low_watermark(_parse_ratio("PYTORCH_MPS_HIGH_WATERMARK_RATIO", high_text), environ)
        )
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
                "which torch refuses at start; lower it or unset it and mpslaunch picks one"
            )
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
        raise MpslaunchError(
            f"{name}={text!r} must be a number from 0.0 to {MPS_WATERMARK_MAX}; fix or unset it"
        )
    return value


def _ratio_text(value: float) -> str:
    return f"{value:.4f}".rstrip("0").rstrip(".") if value else "0.0"


# ---------------------------------------------------------------- Accelerate's launch options


def with_gpu_ids(machine: Machine, settings: Settings, environ: Mapping[str, str]) -> Machine:
    """The machine as the ranks will see it with CUDA_VISIBLE_DEVICES=gpu_ids (Accelerate's
    meaning: driver numbers). Without NVIDIA GPUs it changes nothing (a warning says so)."""
    gpu_ids = settings.gpu_ids
    if gpu_ids in (None, "all") or not machine.cuda_devices:
        return machine
    source = settings.named("gpu_ids")
    if "CUDA_VISIBLE_DEVICES" in environ:
        raise MpslaunchError(
            f"{source} and CUDA_VISIBLE_DEVICES="
            f"{environ['CUDA_VISIBLE_DEVICES']} both choose GPUs; unset one of them"
        )
    ids = [int(part) for part in gpu_ids.split(",")]
    count = len(machine.cuda_devices)
    if max(ids) >= count or len(set(ids)) != len(ids):
        raise MpslaunchError(
            f"{source} names GPUs this machine does not have, or one "
            f"twice: {count} NVIDIA GPU{'s are' if count != 1 else ' is'} visible "
            f"(numbers 0 to {count - 1})"
        )
    return machine._replace(cuda_devices=tuple(machine.cuda_devices[i] for i in ids))


def check_multi_gpu(options: LaunchOptions, settings: Profile, device: str) -> None:
    world = settings.processes * settings.num_machines
    if options.multi_gpu and not (device == "cuda" and world > 1):
        raise MpslaunchError(
            f"--multi_gpu asks for several GPUs, but the plan is {world} process"
            f"{'es' if world > 1 else ''} on {device}; mpslaunch starts one process per visible "
            "NVIDIA GPU without it, so drop --multi_gpu, or what asks for one process"
        )


def accelerate_environment(
    request: LaunchOptions, settings: Profile, device: str
) -> dict[str, str]:
    """The variables `accelerate launch` sets for these options (accelerate/utils/launch.py)."""
    env = {}
    if device == "cuda" and settings.gpu_ids not in (None, "all"):
        env["CUDA_VISIBLE_DEVICES"] = settings.gpu_ids
    if request.num_cpu_threads_per_process is not None:
        env["OMP_NUM_THREADS"] = str(request.num_cpu_threads_per_process)
    if settings.dynamo_backend != "no":
        env.update(
            {
                "ACCELERATE_DYNAMO_BACKEND": settings.dynamo_backend.upper(),
                "ACCELERATE_DYNAMO_MODE": settings.dynamo_mode,
                "ACCELERATE_DYNAMO_USE_FULLGRAPH": str(settings.dynamo_use_fullgraph),
                "ACCELERATE_DYNAMO_USE_DYNAMIC": str(settings.dynamo_use_dynamic),
                "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": str(
                    settings.dynamo_use_regional_compilation
                ),
            }
        )
    if settings.debug:
        env["ACCELERATE_DEBUG_MODE"] = "true"
    return env


def accelerate_notes(
    request: LaunchOptions, settings: Settings, device: str, env: Mapping[str, str]
) -> tuple[str, ...]:
    """For --dry_run: what each of Accelerate's options given became."""
    notes = []
    if request.multi_gpu:
        notes.append(f"--multi_gpu: checked: {settings.num_processes} processes, one per GPU")
    if "CUDA_VISIBLE_DEVICES" in env:
        notes.append(
            f"{settings.named('gpu_ids')}: CUDA_VISIBLE_DEVICES="
            f"{env['CUDA_VISIBLE_DEVICES']} for the ranks, and only these GPUs count"
        )
    if request.num_cpu_threads_per_process is not None:
        notes.append(
            f"--num_cpu_threads_per_process {request.num_cpu_threads_per_process}: "
            f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}"
        )
    if "ACCELERATE_DYNAMO_BACKEND" in env:
        dynamo = " ".join(f"{key}={value}" for key, value in env.items() if "_DYNAMO_" in key)
        notes.append(f"{settings.named('dynamo_backend')}: {dynamo}")
    if settings.debug:
        notes.append(f"{settings.named('debug')}: ACCELERATE_DEBUG_MODE=true")
    if request.tee is not None:
        notes.append(
            f"--tee {request.tee}: every rank's output always reaches the console "
            "(prefixed [rankN]), and with --log_dir also its files"
        )
    if request.monitor_interval is not None:
        notes.append(
            f"--monitor_interval {request.monitor_interval:g}: torch.distributed.run's "
            "--monitor-interval"
        )
    return tuple(notes)


# What only torch.distributed.run uses: nothing to do with one process.
SEVERAL_PROCESS_OPTIONS = (
    "max_restarts",
    "rdzv_backend",
    "main_process_ip",
    "main_process_port",
    "machine_rank",
    "monitor_interval",
)


def no_effect(
    request: LaunchOptions, settings: Settings, device: str, multi: bool, rank_mode: bool = False
) -> tuple[str, ...]:
    """Options given that change nothing in this plan, named rather than silently dropped (in
    rank mode the machines are SLURM's tasks, and --num_processes, 1, is each task's)."""
    warnings = []
    if settings.gpu_ids not in (None, "all") and device != "cuda":
        warnings.append(f"{settings.named('gpu_ids')} has no effect on {device}")
    idle = [f"--{key}" for key in SEVERAL_PROCESS_OPTIONS if getattr(request, key) is not None]
    if idle and not multi:
        warnings.append(
            f"{', '.join(idle)} {'has' if len(idle) == 1 else 'have'} no effect with one process"
        )
    if rank_mode and request.monitor_interval is not None:
        warnings.append(
            "--monitor_interval has no effect here: SLURM started the ranks, and no "
            "torch agent watches them"
        )
    if request.num_processes is not None and settings.num_machines > 1 and not rank_mode:
        # Accelerate's --num_processes counts every machine's processes; an Accelerate habit here
        # would start num_machines times too many.
        total = request.num_processes * settings.num_machines
        warnings.append(
            f"--num_processes {request.num_processes} counts this machine's processes "
            f"(Accelerate's counts every machine's): {total} in all"
        )
    return tuple(warnings)
