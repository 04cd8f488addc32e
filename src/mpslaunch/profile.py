"""Profiles: what the user wants, as plain data, read from and written to YAML.

A profile knows nothing about the machine. Files are parsed as data only (no object is ever
constructed), checked key by key with the file and line in every message, and written
atomically, so an interrupted write never loses the old profile.
"""

from __future__ import annotations

import codecs
import dataclasses
import os
import re
import stat
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from mpslaunch.errors import MpslaunchError

if TYPE_CHECKING:  # for annotations only: yaml is imported where a profile is read
    import yaml

PROFILE_VERSION = 1
MAX_PROFILE_BYTES = 1_000_000  # a profile is a few hundred bytes; refuse to parse a huge file
DEVICES = ("auto", "mps", "cuda", "cpu")
PRECISIONS = ("no", "fp16", "bf16")
RDZV_BACKENDS = ("static", "c10d")
# Accelerate's torch.compile settings (accelerate launch --dynamo_*), passed on as ACCELERATE_DYNAMO_*;
# its TPU, Neuron and HPU backends are left out: mpslaunch runs on mps, cuda or cpu.
DYNAMO_BACKENDS = ("no", "eager", "aot_eager", "inductor", "aot_ts_nvfuser", "nvprims_nvfuser",
                   "cudagraphs", "ofi", "fx2trt", "onnxrt", "tensorrt", "tvm")
DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune")
RDZV_TIMEOUT = 900  # torchrun's own default, in seconds
RDZV_TIMEOUT_MAX = 365 * 24 * 3600  # far below what Python's and torch's timeouts can hold
# torch rejects a high watermark ratio above 2.0 (MPSAllocator.mm); 0.0 means "no limit".
MPS_WATERMARK_MAX = 2.0
MPS_KEYS = ("mps_fallback", "mps_memory_cap")  # they mean something on a Mac only


@dataclass(frozen=True)
class Profile:
    version: int = PROFILE_VERSION
    device: str = "auto"
    mixed_precision: str = "no"
    num_processes: int | None = None  # None: one per visible GPU on cuda (as Accelerate), else 1
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    # The main address reaches machine 0 through NAT or port forwarding: not one of its own.
    main_process_ip_via_nat: bool = False
    main_process_port: int = 0  # 0: pick a free port
    rdzv_backend: str = "static"
    rdzv_timeout: int = RDZV_TIMEOUT  # seconds the machines wait for each other
    max_restarts: int = 0
    mps_fallback: bool = True  # PYTORCH_ENABLE_MPS_FALLBACK: run ops without an MPS kernel on CPU
    mps_memory_cap: float | None = None  # PYTORCH_MPS_HIGH_WATERMARK_RATIO
    # Accelerate's own settings, under its names; the child's Accelerator() reads them.
    gpu_ids: str | None = None  # "0,2": CUDA_VISIBLE_DEVICES for the ranks; None or "all": every GPU
    dynamo_backend: str = "no"
    dynamo_mode: str = "default"
    dynamo_use_fullgraph: bool = False
    dynamo_use_dynamic: bool = False
    dynamo_use_regional_compilation: bool = False
    debug: bool = False  # ACCELERATE_DEBUG_MODE: Accelerate checks its collective operations

    def replace(self, **changes: object) -> "Profile":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


# Which Python types each key accepts (bool is not an int here, ints are accepted as floats).
_KEY_TYPES: dict[str, tuple[type, ...]] = {
    "version": (int,),
    "device": (str,),
    "mixed_precision": (str,),
    "num_processes": (int, type(None)),
    "num_machines": (int,),
    "machine_rank": (int,),
    "main_process_ip": (str, type(None)),
    "main_process_ip_via_nat": (bool,),
    "main_process_port": (int,),
    "rdzv_backend": (str,),
    "rdzv_timeout": (int,),
    "max_restarts": (int,),
    "mps_fallback": (bool,),
    "mps_memory_cap": (float, int, type(None)),
    "gpu_ids": (str, type(None)),
    "dynamo_backend": (str,),
    "dynamo_mode": (str,),
    "dynamo_use_fullgraph": (bool,),
    "dynamo_use_dynamic": (bool,),
    "dynamo_use_regional_compilation": (bool,),
    "debug": (bool,),
}
KNOWN_KEYS = tuple(f.name for f in fields(Profile))
assert set(_KEY_TYPES) == set(KNOWN_KEYS)


# ---------------------------------------------------------------- checking values


def check_value(key: str, value: object) -> str | None:
    """Why `value` is not allowed for `key`, or None. Shared by files, flags and the questionnaire."""
    if not _has_type(value, _KEY_TYPES[key]):
        wanted = " or ".join("null" if t is type(None) else t.__name__ for t in _KEY_TYPES[key])
        return f"must be {wanted}, not {_type_name(value)}{_quoted(value)}"
    choices = {"device": DEVICES, "mixed_precision": PRECISIONS, "rdzv_backend": RDZV_BACKENDS,
               "dynamo_backend": DYNAMO_BACKENDS, "dynamo_mode": DYNAMO_MODES}
    if key in choices and value not in choices[key]:
        return f"must be one of {', '.join(choices[key])}, not{_quoted(value)}"
    if key in ("num_processes", "num_machines", "rdzv_timeout") and value is not None and value < 1:
        return f"must be 1 or more, not {value}"
    if key == "rdzv_timeout" and value > RDZV_TIMEOUT_MAX:
        return f"must be at most {RDZV_TIMEOUT_MAX} seconds (a year), not {_cut(str(value))}"
    if key in ("machine_rank", "max_restarts") and value < 0:
        return f"must be 0 or more, not {value}"
    if key == "main_process_port" and not 0 <= value <= 65535:
        return f"must be a TCP port from 1 to 65535, or 0 to pick a free one, not {value}"
    if key == "mps_memory_cap" and value is not None and not 0.0 <= value <= MPS_WATERMARK_MAX:
        return (f"must be from 0.0 (no limit) to {MPS_WATERMARK_MAX} (a multiple of the GPU's "
                f"recommended working set; torch rejects more), not {value}")
    if key == "gpu_ids" and value is not None and not re.fullmatch(r"all|\d+(,\d+)*", value):
        return f"must be GPU numbers separated by commas, such as 0,1, or all, not{_quoted(value)}"
    if key == "version" and not 1 <= value <= PROFILE_VERSION:
        return (f"is {value}, but this mpslaunch reads profile version {PROFILE_VERSION} at most; "
                "upgrade mpslaunch or write the profile again with `mpslaunch config`")
    return None


def check_profile(profile: Profile) -> str | None:
    """Rules that tie several keys together; the reason the combination is wrong, or None."""
    if profile.machine_rank >= profile.num_machines:
        return (f"machine_rank {profile.machine_rank} must be below num_machines "
                f"{profile.num_machines} (ranks count from 0)")
    if profile.num_machines > 1 and not profile.main_process_ip:
        return "num_machines is above 1, so main_process_ip (the address of machine 0) is needed"
    return None


def _has_type(value: object, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _quoted(value: object) -> str:
    """The value as a message may quote it: scalars only, cut short. A list or mapping is not
    quoted: through YAML aliases a few hundred bytes can name billions of items."""
    if isinstance(value, (list, dict, set, tuple)):
        return ""
    return " " + _cut(repr(value))


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---------------------------------------------------------------- reading


def load(path: Path) -> Profile:
    """Read and check one profile file. Every problem is an MpslaunchError naming file and line.
    A file that `accelerate config` wrote is read as the profile it means (accelerate_config)."""
    return read(path)[0]


def read(path: Path):
    """(the profile, the Accelerate translation or None): load(), with what an Accelerate file
    was translated from, so that nothing reads the file twice."""
    text = _read_text(path)
    document = _parse(text, path)
    if _written_by_accelerate(document):
        from mpslaunch import accelerate_config  # it imports this module

        translation = accelerate_config.translate(_construct(document, path), path)
        return translation.profile, translation
    values = {}
    for key_node, value_node in document.value:
        key = key_node.value
        where = f"{path}, line {key_node.start_mark.line + 1}"
        if key in values:
            raise MpslaunchError(f"{where}: {key} is set twice; keep one")
        if key not in KNOWN_KEYS:
            raise MpslaunchError(f"{where}: unknown key {_cut(repr(key))}{_suggestion(key)}; "
                                 f"known keys: {', '.join(KNOWN_KEYS)}")
        value = _construct(value_node, path)
        problem = check_value(key, value)
        if problem:
            raise MpslaunchError(f"{where}: {key} {problem}")
        values[key] = float(value) if key == "mps_memory_cap" and value is not None else value
    profile = Profile(**values)
    problem = check_profile(profile)
    if problem:
        raise MpslaunchError(f"{path}: {problem}")
    return profile, None


def read_accelerate(path: Path) -> dict | None:
    """The settings in the file at `path` when Accelerate wrote it; None for an mpslaunch profile."""
    document = _parse(_read_text(path), path)
    return _construct(document, path) if _written_by_accelerate(document) else None


def _written_by_accelerate(document: yaml.MappingNode) -> bool:
    from mpslaunch.accelerate_config import is_accelerate_config

    return is_accelerate_config(key_node.value for key_node, _ in document.value)


def _read_text(path: Path) -> str:
    try:
        if path.is_dir():
            raise MpslaunchError(f"{path} is a folder; give the path of a profile .yaml file")
        # O_NONBLOCK: opening a FIFO must not wait for a writer; then only a regular file is read
        # (/dev/zero has size 0 and never ends), and never more than MAX_PROFILE_BYTES + 1.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with open(descriptor, "rb") as stream:
            status = os.fstat(descriptor)
            if not stat.S_ISREG(status.st_mode):
                raise MpslaunchError(f"{path} is not a regular file; give the path of a profile "
                                     ".yaml file")
            data = stream.read(MAX_PROFILE_BYTES + 1)
        if len(data) > MAX_PROFILE_BYTES:
            raise MpslaunchError(f"{path} is {max(status.st_size, len(data)):,} bytes, far too big "
                                 "for a profile; point to the right file or make a new one with "
                                 "`mpslaunch config`")
        return _decode(data, path)
    except FileNotFoundError:
        raise MpslaunchError(f"no profile at {path}; make one with `mpslaunch config`") from None
    except UnicodeDecodeError:
        raise MpslaunchError(f"{path} is not a text file; a profile is YAML text") from None
    except OSError as error:
        raise MpslaunchError(f"cannot read {path}: {error.strerror}") from None


# Editors on Windows save "Unicode" text as UTF-16 and mark it (and often UTF-8) with a BOM.
_BYTE_ORDER_MARKS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
                     (codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
                     (codecs.BOM_UTF16_BE, "utf-16"))


def _decode(data: bytes, path: Path) -> str:
    """UTF-8, or the encoding its byte-order mark names; UnicodeDecodeError for anything else."""
    encoding = next((name for mark, name in _BYTE_ORDER_MARKS if data.startswith(mark)), "utf-8")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError:
        if encoding == "utf-8":
            raise
        raise MpslaunchError(f"{path} is not a text file: it starts with a byte-order mark for "
                             f"{encoding.upper().removesuffix('-SIG')} but does not decode as "
                             "that; save the profile as UTF-8 text") from None
    if encoding == "utf-8" and _utf16_without_a_mark(data):
        raise MpslaunchError(f"{path} looks like UTF-16 text without a byte-order mark; save it "
                             "as UTF-8 text")
    return text


def _utf16_without_a_mark(data: bytes) -> bool:
    """ASCII text in UTF-16: a NUL in every other byte (it is also valid UTF-8)."""
    even, odd = data[0::2], data[1::2]
    return b"\x00" in data and bool(even.strip(b"\x00")) != bool(odd.strip(b"\x00"))


def _parse(text: str, path: Path) -> yaml.MappingNode:
    import yaml  # here, not at the top: a launch without a profile file never needs it

    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        raise MpslaunchError(f"{path}: not valid YAML: {_one_line(error)}") from None
    except RecursionError:
        raise MpslaunchError(f"{path}: nested far too deeply to be a profile") from None
    if document is None:
        raise MpslaunchError(f"{path} is empty; write it again with `mpslaunch config`")
    if not isinstance(document, yaml.MappingNode):
        raise MpslaunchError(f"{path}, line {document.start_mark.line + 1}: a profile is a "
                             "mapping of keys to values (key: value), not a list or a single value")
    for key_node, _ in document.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise MpslaunchError(f"{path}, line {key_node.start_mark.line + 1}: keys must be plain names")
    return document


def _construct(node: yaml.Node, path: Path) -> object:
    import yaml

    # SafeConstructor refuses tags such as !!python/object: profiles are data, never code.
    constructor = yaml.SafeLoader("")
    try:
        return constructor.construct_object(node, deep=True)
    except RecursionError:  # shallow enough for the composer, too deep for the constructor
        raise MpslaunchError(f"{path}, line {node.start_mark.line + 1}: nested far too deeply "
                             "to be a profile value") from None
    except yaml.YAMLError as error:
        raise MpslaunchError(f"{path}, line {node.start_mark.line + 1}: {_one_line(error)}") from None


def _one_line(error: Exception) -> str:
    problem = getattr(error, "problem", None) or str(error)
    mark = getattr(error, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    return _cut(" ".join(problem.split()), 200) + where


def _suggestion(key: str) -> str:
    import difflib  # only when a key is wrong

    close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---------------------------------------------------------------- writing


def to_yaml(profile: Profile, leave_out: tuple[str, ...] = ()) -> str:
    """The profile as YAML; keys in `leave_out` are not written (loading gives their defaults)."""
    import yaml

    header = "# mpslaunch profile: `mpslaunch config` writes it, `mpslaunch launch` reads it.\n"
    values = {key: value for key, value in profile.to_dict().items() if key not in leave_out}
    return header + yaml.safe_dump(values, sort_keys=False)


def save(profile: Profile, path: Path, leave_out: tuple[str, ...] = ()) -> None:
    """Write atomically: temp file in the same folder, fsync, rename. The old file survives a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, to_yaml(profile, leave_out))


def write_atomically(path: Path, text: str) -> None:
    # A temp file + rename also never follows a symlink planted at `path`: rename replaces it.
    import tempfile  # only when writing

    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(handle, 0o666 & ~_current_umask())
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_folder(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems refuse fsync on folders; the rename is still atomic
    finally:
        os.close(descriptor)


# ---------------------------------------------------------------- locating


def config_dir() -> Path:
    override = os.environ.get("MPSLAUNCH_CONFIG_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs  # only when needed: keeps `launch --config_file` light

    return Path(platformdirs.user_config_dir("mpslaunch", appauthor=False))


def profile_path(config_file: str | None = None, profile_name: str | None = None) -> Path:
    """Where the profile the user means lives (whether or not it exists yet): --config_file PATH,
    else NAME.yaml (default.yaml) in the config folder."""
    if config_file and profile_name:
        raise MpslaunchError("give either --config_file or --profile, not both")
    if config_file:
        return Path(config_file).expanduser()
    name = profile_name or "default"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or name.endswith(".yaml"):
        raise MpslaunchError(f"profile name {name!r} must be a plain name like 'fast' or "
                             "'cpu-4' (letters, digits, '-', '_', '.'), without .yaml")
    return config_dir() / f"{name}.yaml"


def load_active(config_file: str | None = None, profile_name: str | None = None) -> tuple[Profile, Path | None]:
    """The profile in force and its file: an explicit one must exist; a missing default means defaults."""
    return read_active(config_file, profile_name)[:2]


def read_active(config_file: str | None = None, profile_name: str | None = None):
    """load_active(), and the Accelerate translation when the file is an Accelerate config."""
    path = profile_path(config_file, profile_name)
    if config_file or profile_name or path.exists():
        profile, translation = read(path)
        return profile, path, translation
    return Profile(), None, None
