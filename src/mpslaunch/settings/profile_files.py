"""Profile files: finding them, reading them (an mpslaunch profile or a file `accelerate config`
wrote), and writing them.

Paths are pathlib's wherever a file is read or written; a launch with no profile file needs
neither pathlib nor yaml nor the Accelerate translation, so they are imported where used.
Files are parsed as data only (no object is ever constructed), checked key by key with the file
and line in every message, and written atomically, so an interrupted write never loses the old
profile. Reading gives one ProfileFile.
"""

from __future__ import annotations

import codecs
import os
import re
import stat

from mpslaunch import Record, record, user_folder
from mpslaunch.output import MpslaunchError
from mpslaunch.settings.options import BY_NAME, cut
from mpslaunch.settings.paths import missing_profile
from mpslaunch.settings.profile import (
    Profile,
    check_profile,
    check_value,
    unknown_keys_problem,
    written_number_problem,
)

# yaml and pathlib are imported where a profile is read or written (a launch without a profile
# file never needs them); the annotations that name them are never evaluated.
TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on every launch
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    import yaml

    from mpslaunch.settings.accelerate_config import Translation

MAX_PROFILE_BYTES = 1_000_000  # a profile is a few hundred bytes; refuse to parse a huge file


# ---------------------------------------------------------------- reading


@record
class ProfileFile(Record):
    """A profile as read: its file (None: no file, the defaults apply), for a file that
    `accelerate config` wrote the translation it was read through, and the keys the file sets
    (None: every key, as `mpslaunch config` writes them), which messages name by the file.
    Two are equal when their profile, path and translation are: the keys only say how."""

    profile: Profile
    path: Path | None = None
    translation: Translation | None = None
    keys: tuple[str, ...] | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProfileFile) and self[:3] == other[:3]

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self[:3])


def load(path: Path) -> Profile:
    """Read and check one profile file. Every problem is an MpslaunchError naming file and line.
    A file that `accelerate config` wrote is read as the profile it means (accelerate_config)."""
    return read(path).profile


def read(path: Path) -> ProfileFile:
    """The profile in the file at `path`, and what an Accelerate file was translated from, so
    that nothing reads the file twice."""
    document = _parse(_read_text(path), path)
    if _written_by_accelerate(document):
        translation = _translate(document, path)
        return ProfileFile(translation.profile, path, translation, translation.keys)
    unknown = unknown_keys_problem(
        [(key.value, key.start_mark.line + 1) for key, _ in document.value]
    )
    if unknown:
        raise MpslaunchError(f"{path}, {unknown}")
    values: dict[str, Any] = {}  # each checked against the option table before it is kept
    for key_node, value_node in document.value:
        key = key_node.value
        where = f"{path}, line {key_node.start_mark.line + 1}"
        if key in values:
            raise MpslaunchError(f"{where}: {key} is set twice; keep one")
        value = _as_meant(key, _construct(value_node, path))
        problem = _as_written(value_node, value) or check_value(key, value)
        if problem:
            raise MpslaunchError(f"{where}: {key} {problem}")
        values[key] = float(value) if key == "mps_memory_cap" and value is not None else value
    profile = Profile(**values)
    problem = check_profile(profile)
    if problem:
        raise MpslaunchError(f"{path}: {problem}")
    return ProfileFile(profile, path, keys=tuple(key for key in values if key != "version"))


def _as_written(node: yaml.Node, value: object) -> str | None:
    """A number whose spelling YAML reads otherwise than a person does (8:20, 010)."""
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and getattr(node, "style", None) is None
    ):
        return written_number_problem(node.value, value)
    return None


def _as_meant(key: str, value: Any) -> Any:
    """YAML 1.1 reads an unquoted `no` (or off, false) as False, as Accelerate's files do: for a
    key whose choices include "no" (mixed_precision, dynamo_backend) that is what it means."""
    return "no" if value is False and "no" in BY_NAME[key].choices else value


def read_accelerate(path: Path) -> Translation | None:
    """The translation of the Accelerate config at `path`, read with the profile reader's limits
    and checks; None when it is an mpslaunch profile."""
    document = _parse(_read_text(path), path)
    return _translate(document, path) if _written_by_accelerate(document) else None


def _written_by_accelerate(document: yaml.MappingNode) -> bool:
    from mpslaunch.settings.accelerate_config import is_accelerate_config

    return is_accelerate_config(key_node.value for key_node, _ in document.value)


def _translate(document: yaml.MappingNode, path: Path) -> Translation:
    from mpslaunch.settings.accelerate_config import translate

    return translate(_construct(document, path), path)


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
                raise MpslaunchError(
                    f"{path} is not a regular file; give the path of a profile .yaml file"
                )
            data = stream.read(MAX_PROFILE_BYTES + 1)
        if len(data) > MAX_PROFILE_BYTES:
            raise MpslaunchError(
                f"{path} is {max(status.st_size, len(data)):,} bytes, far too big "
                "for a profile; point to the right file or make a new one with "
                "`mpslaunch config`"
            )
        return _decode(data, path)
    except FileNotFoundError:
        raise MpslaunchError(missing_profile(path, user_folder("config"))) from None
    except UnicodeDecodeError:
        raise MpslaunchError(f"{path} is not a text file; a profile is YAML text") from None
    except OSError as error:
        raise MpslaunchError(f"cannot read {path}: {error.strerror}") from None


# Editors on Windows save "Unicode" text as UTF-16 and mark it (and often UTF-8) with a BOM.
_BYTE_ORDER_MARKS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def _decode(data: bytes, path: Path) -> str:
    """UTF-8, or the encoding its byte-order mark names; UnicodeDecodeError for anything else."""
    encoding = next((name for mark, name in _BYTE_ORDER_MARKS if data.startswith(mark)), "utf-8")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError:
        if encoding == "utf-8":
            raise
        raise MpslaunchError(
            f"{path} is not a text file: it starts with a byte-order mark for "
            f"{encoding.upper().removesuffix('-SIG')} but does not decode as "
            "that; save the profile as UTF-8 text"
        ) from None
    if encoding == "utf-8" and _utf16_without_a_mark(data):
        raise MpslaunchError(
            f"{path} looks like UTF-16 text without a byte-order mark; save it as UTF-8 text"
        )
    return text


def _utf16_without_a_mark(data: bytes) -> bool:
    """ASCII text in UTF-16: a NUL in every other byte (it is also valid UTF-8)."""
    even, odd = data[0::2], data[1::2]
    return b"\x00" in data and bool(even.strip(b"\x00")) != bool(odd.strip(b"\x00"))


def _parse(text: str, path: Path) -> yaml.MappingNode:
    import yaml  # here, not at the top: a launch without a profile file never needs it

    if path.suffix.lower() == ".json":
        # Accelerate reads a .json file as JSON, whose tabs may indent. In valid JSON a tab is
        # only ever space between tokens (inside a string it is written \t): as YAML, a space.
        text = text.replace("\t", " ")
    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        raise MpslaunchError(f"{path}: not valid YAML: {_one_line(error)}") from None
    except RecursionError:
        raise MpslaunchError(f"{path}: nested far too deeply to be a profile") from None
    if document is None:
        raise MpslaunchError(f"{path} is empty; write it again with `mpslaunch config`")
    if not isinstance(document, yaml.MappingNode):
        raise MpslaunchError(
            f"{path}, line {document.start_mark.line + 1}: a profile is a "
            "mapping of keys to values (key: value), not a list or a single value"
        )
    _check_aliases(document, len(text), path)
    for key_node, _ in document.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise MpslaunchError(
                f"{path}, line {key_node.start_mark.line + 1}: keys must be plain names"
            )
    return document


def _check_aliases(document: yaml.Node, text_size: int, path: Path) -> None:
    """Refuse a document whose aliases name far more items than its text holds: a few hundred
    bytes of anchors can name billions, and every later walk over the values would take forever."""
    import yaml

    limit = 1_000 + 10 * text_size
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:  # items once every alias is expanded, each node counted once
        if id(node) not in sizes:
            sizes[id(node)] = limit + 1  # a node that contains itself never ends
            children = (
                node.value
                if isinstance(node, yaml.SequenceNode)
                else [part for pair in node.value for part in pair]
                if isinstance(node, yaml.MappingNode)
                else []
            )
            sizes[id(node)] = min(limit + 1, 1 + sum(size(child) for child in children))
        return sizes[id(node)]

    if size(document) > limit:
        raise MpslaunchError(
            f"{path}: its YAML aliases (*name) repeat anchors into more than "
            f"{limit:,} items, far more than a profile holds; write the values out"
        )


def _construct(node: yaml.Node, path: Path) -> Any:  # the file's data, checked by the caller
    import yaml

    # SafeConstructor refuses tags such as !!python/object: profiles are data, never code.
    constructor = yaml.SafeLoader("")
    try:
        return constructor.construct_object(node, deep=True)
    except RecursionError:  # shallow enough for the composer, too deep for the constructor
        raise MpslaunchError(
            f"{path}, line {node.start_mark.line + 1}: nested far too deeply to be a profile value"
        ) from None
    except yaml.YAMLError as error:
        raise MpslaunchError(
            f"{path}, line {node.start_mark.line + 1}: {_one_line(error)}"
        ) from None


def _one_line(error: Exception) -> str:
    problem = getattr(error, "problem", None) or str(error)
    mark = getattr(error, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    return cut(" ".join(problem.split()), 200) + where


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


def write_atomically(path: Path, text: str | bytes) -> None:
    # A temp file + rename also never follows a symlink planted at `path`: rename replaces it.
    import tempfile  # only when writing

    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(handle, 0o666 & ~_current_umask())
        with os.fdopen(handle, "wb") as stream:
            stream.write(text.encode() if isinstance(text, str) else text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp_name, path)
    except BaseException:
        if os.path.exists(temp_name):
            os.unlink(temp_name)
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
    from pathlib import Path

    return Path(user_folder("config"))


def profile_path(config_file: str | None = None, profile_name: str | None = None) -> Path:
    """Where the profile the user means lives (whether or not it exists yet): --config_file PATH,
    else NAME.yaml (default.yaml) in the config folder."""
    if config_file and profile_name:
        raise MpslaunchError("give either --config_file or --profile, not both")
    from pathlib import Path

    if config_file:
        return Path(config_file).expanduser()
    name = profile_name or "default"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or name.endswith(".yaml"):
        raise MpslaunchError(
            f"profile name {name!r} must be a plain name like 'fast' or "
            "'cpu-4' (letters, digits, '-', '_', '.'), without .yaml"
        )
    return config_dir() / f"{name}.yaml"


def denied(path: Path) -> str | None:
    """Why this user cannot even look for `path` (a folder on the way it may not search, as
    with `sudo -u other` and HOME=/root), or None when it can."""
    from mpslaunch.settings.paths import denied_at

    try:
        os.stat(path)
    except PermissionError:
        return denied_at(str(path))
    except OSError:
        pass
    return None


def check_writable_place(path: Path) -> None:
    """Refuse, before anything is asked or read, a profile path this user cannot reach."""
    why = denied(path)
    if why:
        raise MpslaunchError(
            f"cannot write {path}: permission denied ({why}); choose another place "
            "with --config_file PATH or MPSLAUNCH_CONFIG_DIR"
        )


def read_active(config_file: str | None = None, profile_name: str | None = None) -> ProfileFile:
    """The profile in force: an explicit one must exist; a missing default means the defaults."""
    if (
        config_file
        or profile_name
        or os.path.exists(os.path.join(user_folder("config"), "default.yaml"))
    ):
        return read(profile_path(config_file, profile_name))
    return ProfileFile(Profile())
