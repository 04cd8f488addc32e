"""Accelerate's config files (`accelerate config`, `accelerate config default`) as mpslaunch profiles.

Pure translation of the file's mapping into Profile fields: what has the same meaning maps,
settings that change nothing here (TPU defaults, empty plugin sections) are dropped, and what
cannot map (DeepSpeed, FSDP, TPUs, SageMaker, fp8, other accelerators) is refused in one line
that names the key and says why. Accelerate's num_processes counts every machine; mpslaunch's
counts this machine. Also: where Accelerate keeps its default config file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from mpslaunch.errors import MpslaunchError
from mpslaunch.profile import Profile, check_profile, check_value

# Keys only an Accelerate file has: one of them makes the file Accelerate's.
MARKERS = ("compute_environment", "distributed_type")

# What mpslaunch does not do, and what to do instead (also used by `launch` for the same flags).
_PLUGIN = ("mpslaunch starts plain data-parallel processes; give Accelerator() its {what} in the "
           "script ({how}), or run it with `accelerate launch`")
WAYS = {
    "DeepSpeed": _PLUGIN.format(what="DeepSpeed plugin",
                                how="Accelerator(deepspeed_plugin=DeepSpeedPlugin(...))"),
    "FSDP": _PLUGIN.format(what="FSDP plugin",
                           how="Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...))"),
    "Megatron-LM": _PLUGIN.format(what="Megatron-LM plugin",
                                  how="Accelerator(megatron_lm_plugin=MegatronLMPlugin(...))"),
    "N-d parallelism": _PLUGIN.format(what="parallelism config",
                                      how="Accelerator(parallelism_config=ParallelismConfig(...))"),
    "fp8": ("mpslaunch's mixed precision is no, fp16 or bf16; for fp8 give Accelerator() "
            "mixed_precision='fp8' and its recipe in the script, on a GPU that has fp8"),
    "TPUs": "mpslaunch runs on mps, cuda or cpu; use `accelerate launch` on a TPU machine",
    "SageMaker": ("mpslaunch runs on this machine (and others you name with --num_machines); use "
                  "`accelerate launch` for Amazon SageMaker"),
    "MPI": ("several CPU processes run through torch.distributed.run: use --cpu --num_processes N, "
            "and --num_machines, --machine_rank, --main_process_ip for several machines"),
    "CPU affinity": ("mpslaunch does not pin processes to cores; size each process with "
                     "--num_cpu_threads_per_process N, or start mpslaunch under numactl or taskset"),
    "other accelerators": "mpslaunch runs on mps, cuda or cpu; use `accelerate launch` for this device",
}

_DEVICES = {"MULTI_CPU": "cpu", "MULTI_GPU": "cuda", "MPS": "mps", "NO": None}
_PLUGIN_TYPES = {"DEEPSPEED": "DeepSpeed", "FSDP": "FSDP", "MEGATRON_LM": "Megatron-LM", "XLA": "TPUs"}
# Sections and settings that change nothing while they hold Accelerate's default (empty, off).
_IDLE_WHEN_EMPTY = {
    "deepspeed_config": "DeepSpeed", "fsdp_config": "FSDP", "megatron_lm_config": "Megatron-LM",
    "parallelism_config": "N-d parallelism", "fp8_config": "fp8", "mpirun_config": "MPI",
    "downcast_bf16": "TPUs", "tpu_use_cluster": "TPUs", "tpu_use_sudo": "TPUs", "tpu_name": "TPUs",
    "tpu_zone": "TPUs", "command_file": "TPUs", "commands": "TPUs", "tpu_vm": "TPUs", "tpu_env": "TPUs",
    "enable_cpu_affinity": "CPU affinity",
}
# Meaningless here whatever they hold: TPU-only, or what mpslaunch's static rendezvous does anyway.
_DROPPED = ("main_training_function", "same_network")
_SAME_NAME = ("num_machines", "machine_rank", "main_process_ip", "debug")
_DYNAMO_KEYS = ("dynamo_backend", "dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic",
                "dynamo_use_regional_compilation")
KNOWN = (*MARKERS, "use_cpu", "mixed_precision", "fp16", "num_processes", "main_process_port",
         "rdzv_backend", "gpu_ids", "dynamo_config", "dynamo_backend", *_SAME_NAME,
         *_IDLE_WHEN_EMPTY, *_DROPPED)
# `accelerate config default` (write_basic_config) on a machine without CUDA, every Mac included:
# use_cpu true, without asking. Any mixed_precision.
_BASIC_CPU = {"compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": "NO",
              "downcast_bf16": False, "enable_cpu_affinity": False, "machine_rank": 0,
              "main_training_function": "main", "num_machines": 1, "num_processes": 1,
              "rdzv_backend": "static", "same_network": False, "tpu_use_cluster": False,
              "tpu_use_sudo": False, "use_cpu": True}


@dataclass(frozen=True)
class Translation:
    profile: Profile
    basic_cpu: bool  # use_cpu: true as `accelerate config default` writes it on any Mac, unasked


def is_accelerate_config(keys) -> bool:
    return any(key in MARKERS for key in keys)


def translate(config: Mapping[str, object], where: object) -> Translation:
    """The profile an Accelerate config means; MpslaunchError naming the key for what cannot map."""
    def refuse(key: str, why: str) -> MpslaunchError:
        return MpslaunchError(f"{where}: Accelerate's {key} cannot be translated: {why}")

    environment = config.get("compute_environment", "LOCAL_MACHINE")
    if environment != "LOCAL_MACHINE":
        raise refuse(f"compute_environment {environment}", WAYS["SageMaker"])
    device = _device(config, refuse)
    unknown = [key for key in config if key not in KNOWN]
    if unknown:
        raise refuse(str(unknown[0]), "this mpslaunch knows the keys of Accelerate 1.15's "
                     "`accelerate config`; remove the key or write the profile with `mpslaunch config`")
    for key, kind in _IDLE_WHEN_EMPTY.items():
        if config.get(key) not in (None, False, {}, [], ""):
            raise refuse(key, WAYS[kind])
    values = {key: config[key] for key in _SAME_NAME if key in config}
    values["device"] = device
    values["mixed_precision"] = _precision(config, refuse)
    values.update(_dynamo(config, refuse))
    if config.get("main_process_port") is not None:
        values["main_process_port"] = config["main_process_port"]
    if config.get("rdzv_backend") is not None:
        values["rdzv_backend"] = config["rdzv_backend"]
    gpu_ids = config.get("gpu_ids")
    if gpu_ids is not None:
        values["gpu_ids"] = str(gpu_ids).replace(" ", "")  # YAML reads `gpu_ids: 0` as a number
    processes = _processes_per_machine(config, refuse)
    if processes is not None:
        values["num_processes"] = processes
    for key, value in values.items():
        problem = check_value(key, value)
        if problem:
            raise MpslaunchError(f"{where}: Accelerate's {key} {problem}")
    profile = Profile(**values)
    problem = check_profile(profile)
    if problem:
        raise MpslaunchError(f"{where}: {problem}")
    return Translation(profile, basic_cpu=_is_basic_cpu(config))


def _device(config: Mapping[str, object], refuse) -> str:
    kind = config.get("distributed_type", "NO")
    kind = "NO" if kind is False else kind  # YAML reads a hand-written, unquoted NO as false
    if kind in _PLUGIN_TYPES:
        raise refuse(f"distributed_type {kind}", WAYS[_PLUGIN_TYPES[kind]])
    if kind not in _DEVICES:
        raise refuse(f"distributed_type {kind}", WAYS["other accelerators"])
    if config.get("use_cpu") is True:
        return "cpu"
    return _DEVICES[kind] or "auto"


def _precision(config: Mapping[str, object], refuse) -> object:
    precision = config.get("mixed_precision")
    if precision is None:  # files from before mixed_precision had `fp16: true`
        return "fp16" if config.get("fp16") else "no"
    if precision is False:  # an unquoted `no`, read by YAML as false
        return "no"
    if isinstance(precision, str) and precision.lower() == "fp8":
        raise refuse("mixed_precision fp8", WAYS["fp8"])
    return precision.lower() if isinstance(precision, str) else precision


def _dynamo(config: Mapping[str, object], refuse) -> dict[str, object]:
    section = dict(config.get("dynamo_config") or {})
    if "dynamo_backend" in config:  # the older top-level spelling
        section.setdefault("dynamo_backend", config["dynamo_backend"])
    values = {key: section[key] for key in _DYNAMO_KEYS if key in section}
    if isinstance(values.get("dynamo_backend"), str):
        values["dynamo_backend"] = values["dynamo_backend"].lower()  # Accelerate writes INDUCTOR
    unknown = [key for key in section if key not in _DYNAMO_KEYS]
    if unknown:
        raise refuse(f"dynamo_config.{unknown[0]}", f"mpslaunch knows {', '.join(_DYNAMO_KEYS)}; "
                     "remove it")
    return values


def _processes_per_machine(config: Mapping[str, object], refuse) -> object:
    total = config.get("num_processes")
    if total is None or total == -1:  # -1: `accelerate config` left it to the launch command
        return None
    machines = config.get("num_machines", 1)
    if isinstance(total, int) and isinstance(machines, int) and machines > 1:
        if total % machines:
            raise refuse(f"num_processes {total}", f"it counts every machine, and {machines} "
                         "machines cannot share it evenly")
        return total // machines
    return total


def _is_basic_cpu(config: Mapping[str, object]) -> bool:
    rest = {key: value for key, value in config.items() if key != "mixed_precision"}
    return rest.get("use_cpu") is True and all(_BASIC_CPU.get(key, object()) == value
                                               for key, value in rest.items())


# ---------------------------------------------------------------- Accelerate's default file


def default_config_path(environ: Mapping[str, str] = os.environ) -> Path:
    """Where `accelerate config` writes by default (accelerate/commands/config/config_args.py)."""
    from pathlib import Path  # here: `launch` imports this module for WAYS alone

    cache = environ.get("XDG_CACHE_HOME", "~/.cache")
    home = environ.get("HF_HOME", os.path.join(cache, "huggingface"))
    if home.startswith("~") and environ.get("HOME"):  # expanduser, with this environment's HOME
        home = environ["HOME"] + home[1:]
    return Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"


def found_default(environ: Mapping[str, str] = os.environ) -> Path | None:
    path = default_config_path(environ)
    return path if path.is_file() else None


def unused_default_note(environ: Mapping[str, str] = os.environ) -> str | None:
    """For `env` and `config show`: Accelerate's default config exists, and is not used."""
    path = found_default(environ)
    if path is None:
        return None
    return (f"{path} exists and mpslaunch does not use it unless given (--config_file {path}); "
            "import it with `mpslaunch config --from-accelerate`")
