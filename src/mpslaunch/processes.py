"""Process-group and prctl helpers shared by the single-process runner and the torchrun path."""

from __future__ import annotations

import os
import signal
import sys


def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group; one that is already gone is not an error."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def linux_prctl():
    """libc's prctl on Linux (for parent-death signals and subreapers); None elsewhere."""
    if sys.platform != "linux":
        return None
    import ctypes  # only here: the launcher's start-up pays for it only on Linux

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
