"""Where output files go: --log_dir, refused in one line before the plan is announced
(log_dir_problem, which changes nothing, so --dry_run asks it too), then made before anything
starts; without it, several processes write to a temporary folder that is removed after the run,
unless the run failed. Only the newest KEPT_FAILED of those failed runs' folders are kept."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

from mpslaunch.output import MpslaunchError

TEMPORARY_PREFIX = "mpslaunch-logs-"  # in the temporary folder ($TMPDIR, else /tmp)
FAILED_MARK = ".failed"  # in a finished, failed run's folder; a running one's has none
KEPT_FAILED = 10


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
            return (
                f"--log_dir {log_dir} {where} not a folder; give a folder (it is made if missing)"
            )
        if not os.access(place, os.W_OK | os.X_OK):
            reason = errno.EROFS if _read_only(place) else errno.EACCES
            return cannot_write(path, OSError(reason, os.strerror(reason)))
        return None
    return None


def _read_only(place: Path) -> bool:
    """The folder is on a file system mounted read-only (where even root cannot write)."""
    try:
        return bool(os.statvfs(place).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def cannot_write(path: Path, error: OSError) -> str:
    return f"cannot write the output to {path}: {error.strerror}; choose another --log_dir"


def temporary_log_dir() -> str:
    return tempfile.mkdtemp(prefix=TEMPORARY_PREFIX)


def keep_failed(path: str) -> None:
    """Mark the folder of a run that failed as kept, and remove all but the newest KEPT_FAILED
    such folders (never a running one: it has no mark)."""
    try:
        (Path(path) / FAILED_MARK).touch()
    except OSError:  # a full disk: the folder stays, unmarked
        return
    marks = []
    for folder in Path(tempfile.gettempdir()).glob(TEMPORARY_PREFIX + "*"):
        try:
            marks.append(((folder / FAILED_MARK).stat().st_mtime, folder))
        except OSError:  # no mark, or removed meanwhile
            continue
    for _, folder in sorted(marks, reverse=True)[KEPT_FAILED:]:
        shutil.rmtree(folder, ignore_errors=True)
