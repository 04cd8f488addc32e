"""What both run paths share about child processes: the signals that stop a run, exit codes,
killing a process group, and prctl."""

from __future__ import annotations

import os
import signal
import sys

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
FORWARDED_SIGNALS = STOPPING_SIGNALS + (signal.SIGUSR1, signal.SIGUSR2)


def exit_code(returncode: int) -> int:
    """Popen's -N (killed by signal N) becomes 128+N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


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
