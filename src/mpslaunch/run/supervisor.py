"""The one supervisor of a run, for both engines: it installs the launcher's signal handlers for
the run, forwards signals to the run's processes, counts the grace period from the first stopping
signal and SIGKILLs the run's process groups when it ends, and after the run kills what was left
behind. The engines say which processes are the run's (`leaders`: the processes that lead their
own process group: the one child, or the ranks) and what a signal means while they run
(single.py, torchrun/signals.py).

A signal the launcher was started with ignored (SIGHUP under nohup, SIGINT for a shell's `&` job)
stays ignored: no handler is installed over it, and the children inherit the SIG_IGN. Handlers
are installed from the main thread only (mpslaunch.launch() from a thread leaves the caller's).
Only processes that carry the run's marker (processes.py) are swept after the run: a program
calling mpslaunch.launch() keeps its own.

In a SLURM step (`delivered`), slurmstepd signals every process of the step itself (scancel,
a time limit, srun's double Ctrl-C), the run's too: the supervisor forwards nothing it gets
then, so each process gets SLURM's signal once, and a stopping signal still starts the grace
period.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from mpslaunch.run.processes import (STOPPING_SIGNALS, handled_here, kill_group, kill_marked,
                                     may_be_marked, stop_with, sweep_children)


class Supervisor:
    """One run's processes as the launcher oversees them."""

    def __init__(self, run_id: str, grace_seconds: float, leaders: Callable[[], list[int]],
                 second_stop_kills: bool = False, delivered: bool = False):
        self.run_id, self.grace_seconds, self.leaders = run_id, grace_seconds, leaders
        self.second_stop_kills = second_stop_kills  # a second stopping signal means now
        self.delivered = delivered  # SLURM signals the run's processes itself: forward nothing
        self.stops = 0
        self.stopping_signal = 0  # the first stopping signal
        self.time_up = False  # the grace period ended (or a second signal came): the run was killed
        self.timer: threading.Timer | None = None
        self.previous: dict[int, object] = {}

    # ---------------------------------------------------------------- handlers

    @contextmanager
    def handling(self, handlers: Mapping[int, Callable]) -> Iterator[Supervisor]:
        """`handlers` for the run (not over an inherited SIG_IGN), the old ones back after it."""
        if threading.current_thread() is threading.main_thread():
            for signum, handler in handlers.items():
                if handled_here(signum):
                    self.previous[signum] = signal.signal(signum, handler)
        try:
            yield self
        finally:
            self.stop_clock()
            for signum, handler in self.previous.items():
                signal.signal(signum, handler)

    def handles(self, signum: int) -> bool:
        """Whether the run handles `signum` (it was not ignored when the launcher started)."""
        return signum in self.previous

    def ignore_stops(self) -> None:
        """From now on the stopping signals this run handled are ignored (its clean-up runs)."""
        for signum in STOPPING_SIGNALS:
            if signum in self.previous:
                signal.signal(signum, signal.SIG_IGN)

    # ---------------------------------------------------------------- forwarding

    def forward(self, signum: int, _frame=None) -> bool:
        """Send `signum` to the run's processes, unless SLURM has sent it to them itself; whether
        one was there to get it."""
        if self.delivered:
            return bool(self.leaders())
        return self.send(signum)

    def send(self, signum: int) -> bool:
        """Send `signum` to the run's processes; whether one was there to get it."""
        reached = False
        for pid in self.leaders():
            try:
                os.kill(pid, signum)
                reached = True
            except ProcessLookupError:
                pass
        return reached

    def job_control(self, signum: int, _frame=None) -> None:
        """Ctrl-Z (SIGTSTP) and SIGCONT: the run's groups, in sessions of their own, would not
        see them (the kernel drops a terminal stop sent to such a group)."""
        stop_with(signum, self.leaders())

    # ---------------------------------------------------------------- the grace period

    def stopping(self, signum: int) -> None:
        """A stopping signal reached the run: the first starts the grace period."""
        self.stops += 1
        if self.stops == 1:
            self.stopping_signal = signum
            self.timer = threading.Timer(self.grace_seconds, self.kill)
            self.timer.daemon = True
            self.timer.start()
        elif self.second_stop_kills:
            self.kill()

    def kill(self) -> None:
        """The grace period is over: SIGKILL the run's process groups."""
        self.time_up = True
        for pid in self.leaders():
            kill_group(pid)

    def stop_clock(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    @contextmanager
    def counting_every_signal(self) -> Iterator[None]:
        """Count stopping signals whoever handles them (torch's agent takes the handlers over):
        signal numbers arrive through the wakeup pipe, read by a thread of their own."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # set_wakeup_fd requires it
        previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        threading.Thread(target=self._read_signals, args=(read_fd,), name="mpslaunch-grace",
                         daemon=True).start()
        try:
            yield
        finally:
            signal.set_wakeup_fd(previous_fd)
            self.stop_clock()
            os.close(write_fd)  # the reader sees end-of-file and returns

    def _read_signals(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while byte := pipe.read(1):
                if byte[0] in STOPPING_SIGNALS:
                    self.stopping(byte[0])

    # ---------------------------------------------------------------- what was left behind

    def clean_up(self, since: float, callers_children: set[int] | None = None) -> list[int]:
        """After the run: SIGKILL the run's process groups and every process started after `since`
        (a time.time()) that still carries the run's marker; the pids. `callers_children`: our
        children when the run began (the torchrun path, whose ranks and adopted helpers are our
        children too): those are left to the caller, the run's own are killed and reaped."""
        self.stop_clock()
        for pid in self.leaders():
            kill_group(pid)
        swept = []
        if callers_children is not None:
            try:
                swept = sweep_children(self.run_id, callers_children)
            except Exception:  # a broken psutil: kill_marked (below) says so and finds them
                pass
        if may_be_marked(self.run_id):
            swept += kill_marked(self.run_id, since)
        return swept
