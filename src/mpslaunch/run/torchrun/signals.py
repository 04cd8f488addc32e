"""Signals and leftover ranks on the torchrun path.

Until torch's agent owns the ranks, the first stopping signal becomes `Stopped` (128+N, no
traceback; a later one only hurries the watcher); a watcher thread SIGKILLs the ranks
`grace_seconds` after the first stopping signal, or at once on the second; SIGUSR1/2 are
forwarded to the ranks; Ctrl-Z stops the ranks, then the launcher (SIGCONT continues them); a
signal the launcher was started with ignored (nohup's SIGHUP) stays ignored, by torch's agent
too. `sweep()` ends whatever is left after the run. Only processes that carry the run's marker
(run/processes.py) are ever signalled: a program calling mpslaunch.launch() keeps its own.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from mpslaunch.run.processes import (RUN_MARKER, STOPPING_SIGNALS, handled_here, kill_group,
                                     kill_marked, linux_prctl, stop_with)

FORWARDED_ONLY = (signal.SIGUSR1, signal.SIGUSR2)
JOB_CONTROL = (signal.SIGTSTP, signal.SIGCONT)


class Stopped(BaseException):
    """A stopping signal arrived before torch's agent took the signals over.

    A BaseException, like KeyboardInterrupt, so that torch's `except Exception` retry loops
    (rendezvous) do not swallow it; torch's agent still shuts its ranks down in its `finally`.
    """

    def __init__(self, signum: int, summary: str = ""):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.summary = summary  # the launcher's last line, when the stop needs its own words


class LauncherSignals:
    """Our handlers and the grace-period watcher for the run; `quiet()` once the ranks are gone."""

    def __init__(self, grace_seconds: float, run_id: str):
        self.run_id = run_id
        self.previous: dict[int, object] = {}
        self.stopping = False  # Stopped was raised: the run is ending
        self.watcher = _GraceWatcher(grace_seconds, run_id)

    def __enter__(self) -> "LauncherSignals":
        handlers = {**dict.fromkeys(STOPPING_SIGNALS, self._stop),
                    **dict.fromkeys(FORWARDED_ONLY, self._forward),
                    **dict.fromkeys(JOB_CONTROL, self._job_control)}
        for signum, handler in handlers.items():
            if handled_here(signum):
                self.previous[signum] = signal.signal(signum, handler)
        self.watcher.start()
        return self

    def torch_handles(self) -> str:
        """For torch's signals_to_handle: the stopping signals that were not ignored."""
        return ",".join(signal.Signals(signum).name for signum in STOPPING_SIGNALS
                        if signum in self.previous)

    def quiet(self) -> None:
        # torch leaves its handlers installed after the run; a late signal must not raise
        # SignalException (or Stopped) in the middle of our clean-up.
        self.stopping = True
        for signum in STOPPING_SIGNALS:
            if signum in self.previous:
                signal.signal(signum, signal.SIG_IGN)

    def __exit__(self, *_exc) -> None:
        self.watcher.stop()
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _stop(self, signum: int, _frame) -> None:
        # Once: a second signal (GNU timeout sends two) must not raise again while the first
        # is being handled; the watcher has seen it and kills the ranks at once.
        if not self.stopping:
            self.stopping = True
            raise Stopped(signum)

    def _forward(self, signum: int, _frame) -> None:
        for pid in rank_pids(self.run_id):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def _job_control(self, signum: int, _frame) -> None:
        stop_with(signum, rank_pids(self.run_id))


class _GraceWatcher:
    """Reads signal numbers from the wakeup pipe; kills the ranks when their time is up."""

    def __init__(self, grace_seconds: float, run_id: str):
        self.grace_seconds, self.run_id = grace_seconds, run_id
        self.stops = 0
        # The grace period ended (or a second signal came) before torch's agent had stopped the
        # ranks: whatever was left was killed, by us or by torch's own timeout at the same time.
        self.time_up = False
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
            self.timer = threading.Timer(self.grace_seconds, self._kill)
            self.timer.daemon = True
            self.timer.start()
        else:
            self._kill()  # a second Ctrl-C means now

    def _kill(self) -> None:
        self.time_up = True
        kill_ranks(self.run_id)


def kill_ranks(run_id: str) -> list[int]:
    """SIGKILL every rank's process group; torch's agent reaps them as they end."""
    pids = rank_pids(run_id)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def sweep(run_id: str, since: float, before: set[int]) -> list[int]:
    """SIGKILL what is left of the run and reap what was ours; return the pids.

    What is left: our children that carry the run's marker, in a process group other than
    ours, that is the ranks (each leads its own) and, on Linux, the helpers of ranks that
    already exited, which `adopt_orphans` made our children, each with its whole process group;
    then every process started after `since` that carries the marker. Children that are not the
    run's (the caller's own, under mpslaunch.launch()) are left alone; `before`: the pids of our
    children when the run started, whose exit statuses are the caller's to collect.
    """
    swept = []
    for _ in range(10):  # killing a helper can orphan its own children to us: a few rounds
        left = [(pid, pgid) for pid, pgid in children()
                if pgid != os.getpgrp() and carries_marker(pid, run_id)]
        if not left:
            break
        for pid, pgid in left:
            kill_group(pgid)
        _reap([pid for pid, _ in left])
        swept += [pid for pid, _ in left]
    # Helpers of the ranks that ended on their own after we adopted them: dead, unreadable.
    _reap([pid for pid in zombie_children() if pid not in before], seconds=0)
    return swept + kill_marked(run_id, since)


def carries_marker(pid: int, run_id: str) -> bool:
    import psutil

    try:
        return psutil.Process(pid).environ().get(RUN_MARKER) == run_id
    except psutil.Error:  # gone, a zombie (nothing left to signal), or another user's
        return False


def zombie_children() -> list[int]:
    import psutil

    found = []
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except psutil.Error:
            pass
    return found


def child_pids() -> set[int]:
    return {pid for pid, _ in children()}


@contextmanager
def adopt_orphans() -> Iterator[None]:
    """Linux: while the run lasts, what a rank leaves behind when it exits becomes our child
    (PR_SET_CHILD_SUBREAPER) instead of init's, so `sweep` finds it even without the run's
    marker. Elsewhere only the marker finds it."""
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
    while waiting:
        for pid in list(waiting):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid  # already reaped by torch's Popen
            if done:
                waiting.discard(pid)
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(0.01)


def rank_pids(run_id: str) -> list[int]:
    """Our children that lead their own process group and carry the run's marker: the ranks."""
    return sorted(pid for pid, pgid in children() if pgid == pid and carries_marker(pid, run_id))


def children() -> list[tuple[int, int]]:
    """(pid, process group) of each of our children, zombies included."""
    import psutil

    found = []
    for child in psutil.Process().children():
        try:
            found.append((child.pid, os.getpgid(child.pid)))
        except ProcessLookupError:  # a zombie on macOS shows no group; reaped meanwhile on Linux
            found.append((child.pid, child.pid))
    return found
