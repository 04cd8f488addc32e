"""The target must exist before anything starts: a script, a module (-m), or an executable
(--no_python), each refused in one line that says what to check and why.

A script must be a regular file: it is opened without blocking, so that a FIFO named like a
script (whose reader waits for a writer) is refused at once instead of hanging the launch or
its check. The check reads scripts through `open_regular` too.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from mpslaunch.output import MpslaunchError
from mpslaunch.settings import LaunchRequest


def check_target(request: LaunchRequest) -> None:
    if request.module:
        _check_module(request.target)
    elif request.no_python:
        _check_executable(request.target)
    else:
        _check_script(request.target)


def _check_executable(name: str) -> None:
    import shutil  # only with --no_python

    if shutil.which(name) is None:
        raise MpslaunchError(f"{name} is not an executable file (--no_python runs it directly, "
                             "looking on PATH when the name has no '/'); check the path and its "
                             "permissions, or drop --no_python")


def _check_script(target: str) -> None:
    try:
        os.close(open_regular(target))
    except OSError as error:
        raise MpslaunchError(unreadable(_shown(target), error, launching=True)) from None
    if target.endswith(".ipynb"):  # Python reads the notebook's JSON as an expression
        raise MpslaunchError(f"{_shown(target)} is a Jupyter notebook, which python cannot run; "
                             f"export its code with `jupyter nbconvert --to script {target}` and "
                             "launch the .py file it writes")


class NotAFileError(OSError):
    """A path that is neither a regular file nor a folder: a FIFO, a socket, a device."""

    def __init__(self, path: str, kind: str):
        super().__init__(errno.EINVAL, f"{kind}, not a file", path)
        self.kind = kind


_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


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


def unreadable(shown: str, error: OSError, launching: bool = False) -> str:
    """Why the script `shown` cannot be read, and what to do, in one sentence."""
    or_module = ", or use -m to run a module" if launching else ""
    if isinstance(error, NotAFileError):
        return f"{shown} is {error.kind}, not a file; give the training script, a .py file"
    if isinstance(error, IsADirectoryError):
        return f"{shown} is a folder; give the training script (a .py file){or_module}"
    if error.errno == errno.ENOENT and os.path.islink(shown):
        return (f"{shown} is a symbolic link to {os.readlink(shown)}, which does not exist; "
                "check the link with `ls -l`")
    if error.errno == errno.ENOENT:
        return f"no script at {shown} ({_looked_in()}); check the path{or_module}"
    if error.errno == errno.ELOOP:
        return (f"cannot read {shown}: a symbolic link on its path leads back to itself (too many "
                "levels of symbolic links); check the links with `ls -l`")
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"cannot read {shown}: permission denied ({_denied_at(shown)})"
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


def _denied_at(shown: str) -> str:
    """Which step of the path this user may not take: a folder it cannot enter, or the file."""
    absolute = os.path.abspath(shown) if current_folder() else shown
    folders = []
    parent = os.path.dirname(absolute)
    while parent and parent not in folders:
        folders.insert(0, parent)
        parent = os.path.dirname(parent)
    for folder in folders:
        if not os.access(folder, os.X_OK):
            return f"the folder {folder} cannot be searched by this user; see `ls -ld {folder}`"
    return f"this user cannot read the file; see `ls -l {shown}`"


def _shown(target: str) -> str:
    from pathlib import Path  # only on a refusal or a notebook

    return str(Path(target))


def _check_module(name: str) -> None:
    """Like `python -m`, look in the current folder first; never import the module's package."""
    here = current_folder()
    if not _module_exists(name, [*([here] if here else []), *sys.path[1:]]):
        raise MpslaunchError(f"no module named {name!r} can be found from "
                             f"{here or 'here (the current folder was removed)'}; check the name, "
                             "or install the package that provides it")


def _module_exists(name: str, search_path: list[str]) -> bool:
    import importlib.machinery  # only with -m
    import importlib.util

    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return False
    spec = importlib.machinery.PathFinder.find_spec(parts[0], search_path)
    if spec is None:
        return importlib.util.find_spec(parts[0]) is not None  # built-in or frozen
    locations = list(spec.submodule_search_locations or [])
    for part in parts[1:]:
        if not locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, locations)
        if spec is None:
            return False
        locations = list(spec.submodule_search_locations or [])
    return True
