"""Signals and leftover ranks on the torchrun path.

Who does what:
- SIGINT, SIGTERM, SIGHUP, SIGQUIT: once the ranks start, torch's elastic agent owns them (it
  raises SignalException and sends the same signal to every rank's process group). Before that
  (importing torch, rendezvous) our handler turns them into `Stopped`, so the launcher ends
  cleanly with 128+N and no traceback.
- The grace period: torch's own SIGKILL comes after its shutdown timeout (30 s before torch
  2.12), and a second signal only restarts that wait. So a watcher thread sees every signal as
  it arrives (through signal.set_wakeup_fd, which works whoever's Python handler is installed):
  `grace_seconds` after the first stopping signal, or at once on the second, it SIGKILLs every
  rank's process group itself.
- SIGUSR1, SIGUSR2: torch does not handle them (they would kill the launcher), so our handler
  forwards them to every rank (not to the ranks' helpers such as DataLoader workers).
- After the run, `sweep()` SIGKILLs the process group of any rank still there, and on Linux of
  the helpers that ranks which already exited left behind (`adopt_orphans`), and reaps them, so
  nothing the ranks started outlives the launcher.

The ranks are found as this process's children that lead their own process group: torch starts
every rank with start_new_session=True, and the launcher process starts nothing else.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from mpslaunch.run.processes import STOPPING_SIGNALS, kill_group, linux_prctl

FORWARDED_ONLY = (signal.SIGUSR1, signal.SIGUSR2)


class Stopped(BaseException):
    """A stopping signal arrived before torch's agent took the signals over.

    A BaseException, like KeyboardInterrupt, so that torch's `except Exception` retry loops
    (rendezvous) do not swallow it; torch's agent still shuts its ranks down in its `finally`.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class LauncherSignals:
    """Our handlers and the grace-period watcher for the run; `quiet()` once the ranks are gone."""

    def __init__(self, grace_seconds: float):
        self.previous: dict[int, object] = {}
        self.watcher = _GraceWatcher(grace_seconds)

    def __enter__(self) -> "LauncherSignals":
        for signum in STOPPING_SIGNALS:
            self.previous[signum] = signal.signal(signum, self._stop)
        for signum in FORWARDED_ONLY:
            self.previous[signum] = signal.signal(signum, self._forward)
        self.watcher.start()
        return self

    def quiet(self) -> None:
        # torch leaves its handlers installed after the run; a late signal must not raise
        # SignalException in the middle of our clean-up.
        for signum in STOPPING_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

    def __exit__(self, *_exc) -> None:
        self.watcher.stop()
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    @staticmethod
    def _stop(signum: int, _frame) -> None:
        raise Stopped(signum)

    @staticmethod
    def _forward(signum: int, _frame) -> None:
        for pid in rank_pids():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass


class _GraceWatcher:
    """Reads signal numbers from the wakeup pipe; kills the ranks when their time is up."""

    def __init__(self, grace_seconds: float):
        self.grace_seconds = grace_seconds
        self.stops = 0
        self.timer: threading.Timer | None = None
        self.previous_fd = -1
        self.read_fd = self.write_fd = -1

    def start(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # set_wakeup_fd requires it
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="mpslaunch-grace", daemon=True).start()

    def stop(self) -> None:
        signal.set_wakeup_fd(self.previous_fd)
        if self.timer is not None:
            self.timer.cancel()
        os.close(self.write_fd)  # the watcher reads end-of-file and returns

    def _watch(self) -> None:
        with os.fdopen(self.read_fd, "rb", buffering=0) as pipe:
            while byte := pipe.read(1):
                if byte[0] in STOPPING_SIGNALS:
                    self._stopping()

    def _stopping(self) -> None:
        self.stops += 1
        if self.stops == 1:
            self.timer = threading.Timer(self.grace_seconds, kill_ranks)
            self.timer.daemon = True
            self.timer.start()
        else:
            kill_ranks()  # a second Ctrl-C means now


def kill_ranks() -> list[int]:
    """SIGKILL every rank's process group; torch's agent reaps them as they end."""
    pids = rank_pids()
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def sweep() -> list[int]:
    """SIGKILL what is left of the run and reap it; return the pids.

    What is left: our children in a process group other than ours, that is the ranks (each
    leads its own) and, on Linux, the helpers of ranks that already exited, which
    `adopt_orphans` made our children. Each goes with its whole process group.
    """
    swept = []
    for _ in range(10):  # killing a helper can orphan its own children to us: a few rounds
        left = [(pid, pgid) for pid, pgid in children() if pgid != os.getpgrp()]
        if not left:
            break
        for pid, pgid in left:
            kill_group(pgid)
        _reap([pid for pid, _ in left])
        swept += [pid for pid, _ in left]
    return swept


@contextmanager
def adopt_orphans() -> Iterator[None]:
    """Linux: while the run lasts, what a rank leaves behind when it exits becomes our child
    (PR_SET_CHILD_SUBREAPER) instead of init's, so `sweep` can find and end it. Elsewhere a
    helper of a rank that exited on its own is not found."""
    prctl = linux_prctl()
    if prctl is None:
        yield
        return
    previous = ctypes.c_int(0)
    prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous))
    prctl(_PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield
    finally:
        prctl(_PR_SET_CHILD_SUBREAPER, previous.value)


_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37  # linux/prctl.h


def _reap(pids: list[int], seconds: float = 5.0) -> None:
    """Wait for SIGKILLed children, bounded: one stuck in the kernel (D state) cannot hang us."""
    waiting, deadline = set(pids), time.monotonic() + seconds
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid  # already reaped by torch's Popen
            if done:
                waiting.discard(pid)
        if waiting:
            time.sleep(0.01)


def rank_pids() -> list[int]:
    """Our children that lead their own process group: the ranks."""
    return sorted(pid for pid, pgid in children() if pgid == pid)


def children(parent: int | None = None) -> list[tuple[int, int]]:
    """(pid, process group) of each child of `parent` (default: us)."""
    parent = os.getpid() if parent is None else parent
    table = _process_table_proc() if Path("/proc/self/stat").exists() else _process_table_ps()
    return [(pid, pgid) for pid, ppid, pgid in table if ppid == parent]


def _process_table_proc() -> list[tuple[int, int, int]]:
    rows = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
        fields = text[text.rindex(")") + 2:].split()
        rows.append((int(entry.name), int(fields[1]), int(fields[2])))
    return rows


def _process_table_ps() -> list[tuple[int, int, int]]:
    # macOS has no /proc; ps prints pid, ppid and process group id the same way there and on Linux.
    try:
        done = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid=", "-o", "pgid="],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = []
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and all(part.lstrip("-").isdigit() for part in parts):
            rows.append(tuple(int(part) for part in parts))
    return rows
