"""The files the user names (a script, the modules it imports): opened for reading only when
they are regular files, and why one cannot be read, in one sentence that says what to do.

A file is opened without blocking, so that a FIFO named like a script (whose reader waits for a
writer) is refused at once instead of hanging the launch or the check; both read scripts here.
"""

from __future__ import annotations

import errno
import os
import stat


class NotAFileError(OSError):
    """A path that is neither a regular file nor a folder: a FIFO, a socket, a device."""

    def __init__(self, path: str, kind: str):
        super().__init__(errno.EINVAL, f"{kind}, not a file", path)
        self.kind = kind


_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def open_regular(path: str | os.PathLike) -> int:
    """A descriptor for reading `path`; OSError unless it is a regular file. Opened without
    blocking, so a FIFO put there between the two looks is refused rather than waited on."""
    _refuse_other_kinds(os.stat(path).st_mode, path)
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        _refuse_other_kinds(os.fstat(descriptor).st_mode, path)
    except OSError:
        os.close(descriptor)
        raise
    return descriptor


def _refuse_other_kinds(mode: int, path) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    for is_kind, kind in _KINDS:
        if is_kind(mode):
            raise NotAFileError(str(path), kind)


def folder_main(path: str | os.PathLike) -> str | None:
    """The `__main__.py` python runs for a folder (`python app/`); None when `path` is not a
    folder holding one."""
    main = os.path.join(path, "__main__.py")
    try:
        return main if os.path.isdir(path) and stat.S_ISREG(os.stat(main).st_mode) else None
    except OSError:
        return None


def unreadable(shown: str, error: OSError, launching: bool = False) -> str:
    """Why the script `shown` cannot be read, and what to do, in one sentence."""
    or_module = ", or use -m to run a module" if launching else ""
    if isinstance(error, NotAFileError):
        return f"{shown} is {error.kind}, not a file; give the training script, a .py file"
    if isinstance(error, IsADirectoryError):
        return (
            f"{shown} is a folder without a __main__.py (what python runs for a folder); "
            f"give the training script (a .py file){or_module}"
        )
    if error.errno == errno.ENOENT and os.path.islink(shown):
        return (
            f"{shown} is a symbolic link to {os.readlink(shown)}, which does not exist; "
            "check the link with `ls -l`"
        )
    if error.errno == errno.ENOENT:
        return f"no script at {shown} ({_looked_in()}); check the path{or_module}"
    if error.errno == errno.ELOOP:
        return (
            f"cannot read {shown}: a symbolic link on its path leads back to itself (too many "
            "levels of symbolic links); check the links with `ls -l`"
        )
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"cannot read {shown}: permission denied ({denied_at(shown)})"
    return f"cannot read {shown} ({error.strerror}); check the path and its permissions"


def _looked_in() -> str:
    here = current_folder()
    return f"looked in {here}" if here else "the current folder was removed"


def current_folder() -> str | None:
    """The working folder, or None when it was removed (Python still runs an absolute path)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def denied_at(shown: str) -> str:
    """Which step of the path this user may not take: a folder it cannot enter, or the file."""
    absolute = os.path.abspath(shown) if current_folder() else shown
    folders: list[str] = []
    parent = os.path.dirname(absolute)
    while parent and parent not in folders:
        folders.insert(0, parent)
        parent = os.path.dirname(parent)
    for folder in folders:
        if not os.access(folder, os.X_OK):
            return f"the folder {folder} cannot be searched by this user; see `ls -ld {folder}`"
    return f"this user cannot read the file; see `ls -l {shown}`"


def missing_profile(path, config_folder: str) -> str:
    """No profile at `path` (a pathlib.Path): the nearest profile beside it, else how to make
    this one. In `config_folder` it is a --profile NAME."""
    import difflib

    named = os.path.realpath(path.parent) == os.path.realpath(config_folder)
    try:
        beside = sorted(found.stem for found in path.parent.glob("*.yaml"))
    except OSError:
        beside = []
    close = difflib.get_close_matches(path.stem, beside, n=1)
    make = f"`mpslaunch config {'--profile ' + path.stem if named else f'--config_file {path}'}`"
    if not close:
        return f"no profile at {path}; make one with {make}"
    near = f"--profile {close[0]}" if named else str(path.with_name(f"{close[0]}.yaml"))
    return f"no profile at {path}; did you mean {near}? (or make this one with {make})"
