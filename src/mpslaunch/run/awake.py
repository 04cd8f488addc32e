"""Keeping a Mac awake while a run lasts: `caffeinate -i -w <launcher pid>`.

-i holds off idle sleep (the display may still sleep); -w ends caffeinate by itself when the
launcher's pid is gone, so even a launcher killed with SIGKILL leaves no caffeinate behind.
It stays in the launcher's process group, where the torchrun path's clean-up never takes it for
a rank; a Ctrl-C in the terminal also ends it then, which is user activity: no idle sleep
follows within a grace period. The launcher ends it as soon as the run is over.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from mpslaunch.machine import CAFFEINATE

_STOP_SECONDS = 2.0


def caffeinate_command(pid: int) -> list[str]:
    return [CAFFEINATE, "-i", "-w", str(pid)]


@contextmanager
def kept_awake(enabled: bool, warn) -> Iterator[None]:
    """While the block runs, a caffeinate holds off idle sleep (when `enabled`: the plan says so
    on macOS only). One that cannot start costs a warning, never the run."""
    holder = _start(warn) if enabled else None
    try:
        yield
    finally:
        if holder is not None:
            _stop(holder)


def _start(warn) -> subprocess.Popen | None:
    try:
        return subprocess.Popen(
            caffeinate_command(os.getpid()),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError as error:
        warn(
            f"cannot start caffeinate ({error.strerror}), so the Mac may sleep during the run; "
            "keep_awake: false in the profile (or --no_keep_awake) skips it"
        )
        return None


def _stop(holder: subprocess.Popen) -> None:
    holder.terminate()
    try:
        holder.wait(_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()
