"""--log_dir: the folder made, or refused in one line, before anything starts, on every path."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mpslaunch.output import MpslaunchError


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
