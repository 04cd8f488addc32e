"""Accelerate's config files (`accelerate config`, `accelerate config default`) as mpslaunch profiles.

Pure translation of the file's mapping into Profile fields, key by key by what `accelerate launch`
does with it (docs/from-accelerate.md): what has the same meaning maps; settings at their off
value, in any spelling, are idle; settings that only tune speed are left out with a one-line
warning; what cannot map (DeepSpeed, FSDP, TPUs, SageMaker, fp8, other accelerators) is refused
in one line that names the key and says why. Accelerate's num_processes counts every machine;
mpslaunch's counts this machine. Also: where Accelerate keeps its default config file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from mpslaunch.output import MpslaunchError
from mpslaunch.settings.accelerate_flags import WAYS
from mpslaunch.settings.profile import Profile, check_profile, check_value

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

# Keys only an Accelerate file has: one of them makes the file Accelerate's.
MARKERS = ("compute_environment", "distributed_type")

_DEVICES = {"MULTI_CPU": "cpu", "MULTI_GPU": "cuda", "MPS": "mps", "NO": None}
_PLUGIN_TYPES = {
    "DEEPSPEED": "DeepSpeed",
    "FSDP": "FSDP",
    "MEGATRON_LM": "Megatron-LM",
    "XLA": "TPUs",
    "TPU": "TPUs",
}
# A plugin's section only counts with its distributed_type (fp8's with mixed_precision fp8):
# elsewhere `accelerate launch` does not use it either, so it is left out with a warning.
_PLUGIN_SECTIONS = {
    "deepspeed_config": "DEEPSPEED",
    "fsdp_config": "FSDP",
    "megatron_lm_config": "MEGATRON_LM",
}
# Sections and settings that change nothing while they hold an off value (is_off).
_IDLE_WHEN_OFF = {
    "parallelism_config": "N-d parallelism",
    "downcast_bf16": "TPUs",
    "tpu_use_cluster": "TPUs",
    "tpu_use_sudo": "TPUs",
    "tpu_name": "TPUs",
    "tpu_zone": "TPUs",
    "command_file": "TPUs",
    "commands": "TPUs",
    "tpu_vm": "TPUs",
    "tpu_env": "TPUs",
}
# Meaningless here whatever it holds: mpslaunch's static rendezvous on machine 0's address is
# what Accelerate's same_network means.
_DROPPED = ("same_network",)
_SAME_NAME = ("num_machines", "machine_rank", "main_process_ip")
_DYNAMO_KEYS = (
    "dynamo_backend",
    "dynamo_mode",
    "dynamo_use_fullgraph",
    "dynamo_use_dynamic",
    "dynamo_use_regional_compilation",
)
# Older Accelerate versions wrote these; Accelerate 1.x no longer knows them.
_OLDER = ("fp16", "dynamo_backend", "use_mps_device", "ipex_config")
KNOWN = (
    *MARKERS,
    "use_cpu",
    "mixed_precision",
    "num_processes",
    "main_process_port",
    "rdzv_backend",
    "gpu_ids",
    "dynamo_config",
    "main_training_function",
    "enable_cpu_affinity",
    "mpirun_config",
    "debug",
    "fp8_config",
    *_PLUGIN_SECTIONS,
    *_SAME_NAME,
    *_IDLE_WHEN_OFF,
    *_DROPPED,
    *_OLDER,
)
_XLA_DYNAMO = ("AOT_TORCHXLA_TRACE_ONCE", "TORCHXLA_TRACE_ONCE")
_OTHER_DYNAMO = ("HPU_BACKEND", "NEURON")
# `accelerate config default` (write_basic_config) on a machine without CUDA, every Mac included:
# use_cpu true, without asking. Any mixed_precision.
_BASIC_CPU = {
    "compute_environment": "LOCAL_MACHINE",
    "debug": False,
    "distributed_type": "NO",
    "downcast_bf16": False,
    "enable_cpu_affinity": False,
    "machine_rank": 0,
    "main_training_function": "main",
    "num_machines": 1,
    "num_processes": 1,
    "rdzv_backend": "static",
    "same_network": False,
    "tpu_use_cluster": False,
    "tpu_use_sudo": False,
    "use_cpu": True,
}


@dataclass(frozen=True)
class Translation:
    profile: Profile
    basic_cpu: bool  # use_cpu: true as `accelerate config default` writes it on any Mac, unasked
    warnings: tuple[str, ...] = ()  # one line each: what was read differently or left out, and why
    keys: tuple[str, ...] = ()  # the profile keys the file gives; the others are defaults


def is_accelerate_config(keys) -> bool:
    return any(key in MARKERS for key in keys)


def is_off(value: object) -> bool:
    """A setting at its off value, in every spelling Accelerate or YAML produces: null, false
    (YAML reads an unquoted no as false), 'no', 'NO', 'false', '', {}, [], and lists or sections
    of nothing but those (the TPU questions write [''] for an empty answer)."""
    if value is None or value is False:
        return True
    if isinstance(value, str):
        return value.strip().lower() in ("", "no", "false")
    if isinstance(value, list):
        return all(is_off(item) for item in value)
    if isinstance(value, dict):
        return all(is_off(item) for item in value.values())
    return False


class _Reader:
    """One file's translation: each key read by Accelerate's meaning, refusals naming the key."""

    def __init__(self, config: Mapping[str, object], where: object):
        self.config = config
        self.where = where
        self.warnings: list[str] = []

    def refuse(self, key: str, why: str) -> MpslaunchError:
        return MpslaunchError(f"{self.where}: Accelerate's {key} cannot be translated: {why}")

    def wrong(self, key: str, wanted: str) -> MpslaunchError:
        return MpslaunchError(
            f"{self.where}: Accelerate's {key} must be {wanted}, not "
            f"{_shown(self.config.get(key))}; write it as `accelerate config` does"
        )

    def warn(self, text: str) -> None:
        self.warnings.append(f"{self.where}: {text}")


def translate(config: Mapping[str, object], where: object) -> Translation:
    """The profile an Accelerate config means; MpslaunchError naming the key for what cannot map."""
    reader = _Reader(config, where)
    _check_environment(reader)
    kind = _distributed_type(reader)
    unknown = [key for key in config if key not in KNOWN]
    if unknown:
        raise reader.refuse(
            _cut(str(unknown[0])),
            "this mpslaunch knows the keys of Accelerate "
            "1.15's `accelerate config` and older ones; remove the key or write the "
            "profile with `mpslaunch config`",
        )
    for key, kind_of in _IDLE_WHEN_OFF.items():
        if not is_off(config.get(key)):
            raise reader.refuse(key, WAYS[kind_of])
    _unused_sections(reader, kind)
    if config.get("main_training_function", "main") not in ("main", None):
        raise reader.refuse("main_training_function", WAYS["TPUs"])
    values: dict[str, Any] = {key: config[key] for key in _SAME_NAME if config.get(key) is not None}
    values["debug"] = _flag(reader, "debug")
    values["device"] = _device(reader, kind)
    values["mixed_precision"] = _precision(reader)
    values.update(_dynamo(reader))
    for key in ("main_process_port", "rdzv_backend"):
        if config.get(key) is not None:
            values[key] = config[key]
    if isinstance(values.get("main_process_port"), str) and values["main_process_port"].isdigit():
        values["main_process_port"] = int(
            values["main_process_port"]
        )  # Accelerate passes it as text
    gpu_ids = config.get("gpu_ids")
    if gpu_ids is not None:
        values["gpu_ids"] = str(gpu_ids).replace(" ", "")  # YAML reads `gpu_ids: 0` as a number
    values.update(_processes(reader, kind, values))
    _speed_only(reader)
    _mpirun(reader, kind, values.get("num_machines", 1))
    for key, value in values.items():
        problem = check_value(key, value)
        if problem:
            raise MpslaunchError(f"{where}: Accelerate's {key} {problem}")
    profile = Profile(**values)
    problem = check_profile(profile)
    if problem:
        raise MpslaunchError(f"{where}: {problem}")
    return Translation(
        profile,
        basic_cpu=_is_basic_cpu(config),
        warnings=tuple(reader.warnings),
        keys=tuple(values),
    )


def _check_environment(reader: _Reader) -> None:
    environment = reader.config.get("compute_environment", "LOCAL_MACHINE")
    if environment in (None, "LOCAL_MACHINE"):
        return
    if not isinstance(environment, str):
        raise reader.wrong("compute_environment", "LOCAL_MACHINE")
    raise reader.refuse(f"compute_environment {_cut(environment)}", WAYS["SageMaker"])


def _distributed_type(reader: _Reader) -> str:
    kind = reader.config.get("distributed_type", "NO")
    if is_off(kind):  # also a hand-written, unquoted NO, which YAML reads as false
        return "NO"
    if not isinstance(kind, str):
        raise reader.wrong("distributed_type", "one of NO, MULTI_CPU, MULTI_GPU")
    kind = kind.upper()
    if kind in _PLUGIN_TYPES:
        raise reader.refuse(f"distributed_type {kind}", WAYS[_PLUGIN_TYPES[kind]])
    if kind not in _DEVICES:
        raise reader.refuse(f"distributed_type {_cut(kind)}", WAYS["other accelerators"])
    return kind


def _unused_sections(reader: _Reader, kind: str) -> None:
    """Plugin sections left over beside another distributed_type (a DeepSpeed, FSDP or
    Megatron-LM kind is refused before this)."""
    for key, owner in _PLUGIN_SECTIONS.items():
        if not is_off(reader.config.get(key)):
            reader.warn(
                f"{key} is left out: distributed_type is {kind}, not {owner}, so "
                "`accelerate launch` does not use it either"
            )
    precision = reader.config.get("mixed_precision")
    if not is_off(reader.config.get("fp8_config")) and not (
        isinstance(precision, str) and precision.lower() == "fp8"
    ):
        reader.warn(
            f"fp8_config is left out: mixed_precision is {_shown(precision)}, not fp8, "
            "so `accelerate launch` does not use it either"
        )


def _flag(reader: _Reader, key: str) -> bool:
    value = reader.config.get(key)
    if is_off(value):
        return False
    if value is True:
        return True
    raise reader.wrong(key, "true or false")


def _device(reader: _Reader, kind: str) -> str:
    if _flag(reader, "use_cpu"):
        return "cpu"
    if _flag(reader, "use_mps_device"):  # older Accelerate: train on the Mac's GPU
        return "mps"
    return _DEVICES[kind] or "auto"


def _precision(reader: _Reader) -> str:
    precision = reader.config.get("mixed_precision")
    if precision is None:  # files from before mixed_precision had `fp16: true`
        return "fp16" if _flag(reader, "fp16") else "no"
    if is_off(precision):
        return "no"
    if not isinstance(precision, str):
        raise reader.wrong("mixed_precision", "no, fp16 or bf16")
    if precision.lower() == "fp8":
        raise reader.refuse("mixed_precision fp8", WAYS["fp8"])
    return precision.lower()


def _dynamo(reader: _Reader) -> dict[str, object]:
    section = reader.config.get("dynamo_config")
    if is_off(section):
        section = {}
    if not isinstance(section, dict):
        raise reader.wrong(
            "dynamo_config", "a section of dynamo_* settings (dynamo_backend: INDUCTOR, ...)"
        )
    section = dict(section)
    if not is_off(reader.config.get("dynamo_backend")):  # the older top-level spelling
        section.setdefault("dynamo_backend", reader.config["dynamo_backend"])
    unknown = [key for key in section if key not in _DYNAMO_KEYS]
    if unknown:
        raise reader.refuse(
            f"dynamo_config.{_cut(str(unknown[0]))}",
            f"mpslaunch knows {', '.join(_DYNAMO_KEYS)}; remove it",
        )
    values = {key: section[key] for key in _DYNAMO_KEYS if section.get(key) is not None}
    backend = values.get("dynamo_backend")
    if is_off(backend):
        values["dynamo_backend"] = "no"
    elif isinstance(backend, str):
        if backend.upper() in _XLA_DYNAMO:
            raise reader.refuse(f"dynamo_backend {backend}", WAYS["TPUs"])
        if backend.upper() in _OTHER_DYNAMO:
            raise reader.refuse(f"dynamo_backend {backend}", WAYS["other accelerators"])
        values["dynamo_backend"] = backend.lower()  # Accelerate writes INDUCTOR
    for key in ("dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation"):
        if is_off(values.get(key, False)):
            values.pop(key, None)
    return values


def _processes(reader: _Reader, kind: str, values: Mapping[str, object]) -> dict[str, object]:
    """num_processes per machine. Accelerate's counts every machine; `distributed_type: NO` is
    one process on one machine whatever else the file says, as `accelerate launch` runs it."""
    total = reader.config.get("num_processes")
    machines = values.get("num_machines", 1)
    if kind == "NO":
        if isinstance(total, int) and not isinstance(total, bool) and total > 1:
            reader.warn(
                f"distributed_type NO is one process, as `accelerate launch` runs it, so "
                f"num_processes {total} is not used; give --num_processes {total} (or "
                "write distributed_type MULTI_GPU or MULTI_CPU) for more"
            )
        if isinstance(machines, int) and not isinstance(machines, bool) and machines > 1:
            reader.warn(
                f"distributed_type NO runs on this machine alone, so num_machines {machines} "
                "is not used"
            )
        return {"num_processes": 1, "num_machines": 1, "machine_rank": 0}
    if total is None or total == -1:  # -1: `accelerate config` left it to the launch command
        return {}
    if isinstance(total, int) and isinstance(machines, int) and machines > 1:
        if total % machines:
            raise reader.refuse(
                f"num_processes {total}",
                f"it counts every machine, and {machines} machines cannot share it evenly",
            )
        return {"num_processes": total // machines}
    return {"num_processes": total}


def _speed_only(reader: _Reader) -> None:
    """Settings that only tune speed: left out, with one line each."""
    if _flag(reader, "enable_cpu_affinity"):
        reader.warn(
            f"enable_cpu_affinity is left out (it only tunes speed): {WAYS['CPU affinity']}"
        )
    ipex = reader.config.get("ipex_config")
    if is_off(ipex):
        return
    if not isinstance(ipex, dict):
        raise reader.wrong("ipex_config", "a section such as {ipex: false}")
    if not is_off(ipex.get("use_xpu")):
        raise reader.refuse("ipex_config.use_xpu", WAYS["other accelerators"])
    reader.warn(
        "ipex_config is left out (Intel's extension only tunes speed on Intel CPUs): "
        "call intel_extension_for_pytorch.optimize in the script to use it"
    )


def _mpirun(reader: _Reader, kind: str, machines: object) -> None:
    """mpirun starts every machine's processes from one host, through its hostfile; mpslaunch
    starts the processes of this machine through torch.distributed.run, one launcher per machine.
    On one machine the two mean the same processes, so the file runs with a note; with several,
    the hostfile decides which host gets which rank, which a file written once on machine 0 cannot
    say for the others, so it is refused rather than guessed."""
    section = reader.config.get("mpirun_config")
    if is_off(section):
        return
    if not isinstance(section, dict):
        raise reader.wrong("mpirun_config", "a section such as {mpirun_hostfile: ~/hostfile}")
    if machines != 1:
        raise reader.refuse(
            "mpirun_config",
            "mpirun starts every machine's processes from one host, "
            "mpslaunch one launcher per machine: remove mpirun_config and run "
            "mpslaunch on each machine with its own --machine_rank",
        )
    hostfile = section.get("mpirun_hostfile")
    reader.warn(
        f"mpirun_config: the processes run on this machine through torch.distributed.run, "
        f"not mpirun (its hostfile {_shown(hostfile)} is not read)"
    )


def _is_basic_cpu(config: Mapping[str, object]) -> bool:
    rest = {key: value for key, value in config.items() if key != "mixed_precision"}
    return rest.get("use_cpu") is True and all(
        _BASIC_CPU.get(key, object()) == value for key, value in rest.items()
    )


def _shown(value: object) -> str:
    """A value as a one-line message may show it: a scalar, cut short; a list or section by its
    kind only (through YAML aliases a few hundred bytes can hold billions of items)."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a section"
    return _cut(repr(value))


def _cut(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    return path if os.path.isfile(path) else None  # False too where HOME cannot be read


def unused_default_note(environ: Mapping[str, str] = os.environ) -> str | None:
    """For `env` and `config show`: Accelerate's default config exists, and is not used."""
    path = found_default(environ)
    if path is None:
        return None
    return (
        f"{path} exists and mpslaunch does not use it unless given (--config_file {path}); "
        "import it with `mpslaunch config --from_accelerate`"
    )
