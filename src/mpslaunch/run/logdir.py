"""Where output files go: --log_dir, made or refused in one line before anything starts; without
it, several processes write to a temporary folder that is removed after the run, unless the run
failed. Only the newest KEPT_FAILED of those failed runs' folders are kept."""

from __future__ import annotations

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
    path = Path(log_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise MpslaunchError(f"--log_dir {log_dir} is a file, not a folder; give a folder (it is "
                             "made if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        # What each run really does in it (torch makes one folder per run as well).
        os.rmdir(tempfile.mkdtemp(prefix=".mpslaunch-check-", dir=path))
    except OSError as error:
        raise MpslaunchError(cannot_write(path, error)) from None
    return path


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
