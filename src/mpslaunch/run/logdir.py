"""--log_dir: refused in one line before the plan is announced (log_dir_problem, which changes
nothing, so --dry_run asks it too), then made before anything starts, on every path."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from mpslaunch.output import MpslaunchError


def usable_log_dir(log_dir: str) -> Path:
    """The --log_dir folder, made if missing, once a folder could be made in it."""
    problem = log_dir_problem(log_dir)
    if problem:
        raise MpslaunchError(problem)
    path = Path(log_dir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        # What each run really does in it (torch makes one folder per run as well).
        os.rmdir(tempfile.mkdtemp(prefix=".mpslaunch-check-", dir=path))
    except OSError as error:
        raise MpslaunchError(cannot_write(path, error)) from None
    return path


def log_dir_problem(log_dir: str) -> str | None:
    """Why the --log_dir folder cannot be there (something not a folder on its path, a folder
    this user cannot write in), without making anything; None when it can."""
    path = Path(log_dir).expanduser()
    for place in (path, *path.parents):
        if not os.path.lexists(place):
            continue
        if not place.is_dir():
            where = "is" if place == path else f"cannot be made: {place} is"
            return f"--log_dir {log_dir} {where} not a folder; give a folder (it is made if missing)"
        if not os.access(place, os.W_OK | os.X_OK):
            return cannot_write(path, PermissionError(errno.EACCES, os.strerror(errno.EACCES)))
        return None
    return None


def cannot_write(path: Path, error: OSError) -> str:
    return f"cannot write the output to {path}: {error.strerror}; choose another --log_dir"
