"""The one supervisor of a run, for both engines: it installs the launcher's signal handlers for
the run, forwards signals to the run's processes, counts the grace period from the first stopping
signal, SIGKILLs the run's process groups when it ends (or at once when another stopping signal
comes), keeps the signal that stopped the run (the exit code is 128 + it), and after the run kills
what was left behind. The engines say which processes are the run's (`leaders`: the processes
that lead their own process group: the one child, or the ranks), whether a stop is forwarded here
or by torch's agent (`forwards_stops`), and what a signal means on their path (single.py,
torchrun/signals.py).

Every decision to pass a signal on is made here: `forward` (the signals only passed on, a stop
where the engine forwards stops) and `death_signal` (what torch's agent sends the ranks). In a
SLURM step (`delivered`), slurmstepd signals every process of the step itself (scancel, a time
limit, srun's double Ctrl-C), the run's too: then nothing the launcher gets is forwarded, so each
process gets SLURM's signal once (a signal that came before the processes existed is sent: SLURM's
did not reach them either), and a stopping signal still starts the grace period.

A signal the launcher was started with ignored (SIGHUP under nohup, SIGINT for a shell's `&` job)
stays ignored: no handler is installed over it, and the children inherit the SIG_IGN. A signal
that is only passed on is taken only where it would end the launcher (its default action), so a
caller's own handler stays in charge. Handlers are installed from the main thread only
(mpslaunch.launch() from a thread leaves the caller's). Only processes that carry the run's
marker (processes.py) are swept after the run: a program calling mpslaunch.launch() keeps its own.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from mpslaunch.run.processes import (
    STOPPING_SIGNALS,
    handled_here,
    kill_group,
    kill_marked,
    may_be_marked,
    stop_with,
    sweep_children,
)

# The same stopping signal again within this long is the same stop: GNU timeout sends its signal
# to the launcher and then to its process group, and a checkpoint being saved must not be killed.
SAME_STOP_SECONDS = 1.0


@contextmanager
def holding_stops() -> Iterator[list[int]]:
    """From the plan line until the run's own handlers are in, the stopping signals that come are
    held in the list yielded, for the run to act on when it starts (it then starts nothing);
    once the run is over, they change nothing (it is ending). Not over an inherited SIG_IGN;
    main thread only."""
    held: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in STOPPING_SIGNALS:
            if handled_here(signum):
                previous[signum] = signal.signal(signum, lambda number, _frame: held.append(number))
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Supervisor:
    """One run's processes as the launcher oversees them."""

    def __init__(
        self,
        run_id: str,
        grace_seconds: float,
        leaders: Callable[[], list[int]],
        forwards_stops: bool = True,
        announce: Callable[[int], None] | None = None,
        delivered: bool = False,
    ):
        self.run_id, self.grace_seconds, self.leaders = run_id, grace_seconds, leaders
        self.forwards_stops = forwards_stops  # False: torch's agent sends the stop to the ranks
        self.delivered = delivered  # SLURM signals the run's processes itself: forward nothing
        self.announce = announce  # called with the first stopping signal, once it reached the run
        self.stopping_signal = 0  # the first stopping signal: the run was stopped by it
        self.first_at = 0.0
        self.killed_at: int | None = (
            None  # None: nothing killed; 0: the grace period ended; N: signal N came
        )
        self.timer: threading.Timer | None = None
        self.previous: dict[int, Callable[..., object] | int | None] = {}  # signal.signal's answers
        self.lock = threading.RLock()  # the handlers and the wakeup reader act in arrival order
        self.wakeup: tuple[int, int, int] | None = (
            None  # read end, write end, the caller's wakeup fd
        )

    # ---------------------------------------------------------------- handlers

    @contextmanager
    def handling(self, handlers: Mapping[int, Callable]) -> Iterator[Supervisor]:
        """`handlers` for the run (see handled_here), the old ones back after it."""
        if threading.current_thread() is threading.main_thread():
            for signum, handler in handlers.items():
                if handled_here(signum):
                    self.previous[signum] = signal.signal(signum, handler)
        try:
            yield self
        finally:
            self.stop_clock()
            for signum, previous in self.previous.items():
                signal.signal(signum, previous)

    def handles(self, signum: int) -> bool:
        """Whether the run handles `signum` (it was not ignored when the launcher started)."""
        return signum in self.previous

    def ignore_stops(self) -> None:
        """From now on the stopping signals this run handled are ignored (its clean-up runs)."""
        for signum in STOPPING_SIGNALS:
            if signum in self.previous:
                signal.signal(signum, signal.SIG_IGN)

    def forget_in_child(self) -> None:
        """In a process forked from the launcher while the run lasts (a rank of a function run
        with fork): the handlers and wakeup descriptor the run found, not the run's."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        if self.wakeup is not None:
            read_fd, write_fd, callers = self.wakeup
            signal.set_wakeup_fd(callers)
            os.close(read_fd)
            os.close(write_fd)

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

    def death_signal(self, default: int | None) -> int | None:
        """What torch's agent sends the ranks when it stops them: the stop's own signal, else
        its `default` (SIGTERM after a rank failed); 0 when SLURM has sent them the stop."""
        if self.stopping_signal and self.delivered:
            return 0
        return self.stopping_signal or default

    def job_control(self, signum: int, _frame=None) -> None:
        """Ctrl-Z (SIGTSTP) and SIGCONT: the run's groups, in sessions of their own, would not
        see them (the kernel drops a terminal stop sent to such a group)."""
        stop_with(signum, self.leaders())

    # ---------------------------------------------------------------- the grace period

    def stop(self, signum: int, missed: bool = False) -> None:
        """A stopping signal reached the run. The first is forwarded (where this engine forwards
        stops; `missed`: it came before the run's processes existed, so it is sent even in a
        SLURM step) and starts the grace period; the same one again at once is the same stop
        (SAME_STOP_SECONDS); any later one kills the run's processes now."""
        with self.lock:
            started = self._stopping(signum, missed)
        self._announce(started)

    def _stopping(self, signum: int, missed: bool = False) -> bool:
        """stop(), under the lock; whether this started the grace period for processes there."""
        now = time.monotonic()
        if self.stopping_signal:
            if signum != self.stopping_signal or now - self.first_at >= SAME_STOP_SECONDS:
                self.kill(signum)
            return False
        self.stopping_signal, self.first_at = signum, now
        if not self.forwards_stops:
            reached = bool(self.leaders())
        else:
            reached = self.send(signum) if missed else self.forward(signum)
        self.timer = threading.Timer(self.grace_seconds, self.kill)
        self.timer.daemon = True
        self.timer.start()
        return reached

    def _announce(self, started: bool) -> None:
        # Said outside the lock: a slow stderr must not hold up a second signal's kill.
        if started and self.announce is not None and self.grace_seconds > 0:
            self.announce(self.stopping_signal)

    def kill(self, second: int = 0) -> None:
        """SIGKILL the run's process groups: the grace period is over (`second` 0), or stopping
        signal `second` came after the first."""
        reached = False
        for pid in self.leaders():
            reached = kill_group(pid) or reached
        if reached and self.killed_at is None:
            self.killed_at = second

    def stop_clock(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def exit_code(self) -> int:
        """A stopped run's exit code: 128 + the first stopping signal."""
        return 128 + self.stopping_signal

    @contextmanager
    def counting_every_signal(self) -> Iterator[None]:
        """Count stopping signals in the order they came and while the main thread is busy (in
        torch's C++, say): their numbers arrive through the wakeup pipe, read by a thread of its
        own and by the main thread's handlers (`drain`). Main thread only, like the handlers."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)  # set_wakeup_fd requires it
        callers = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self.wakeup = (read_fd, write_fd, callers)
        threading.Thread(
            target=self._read_signals, args=(read_fd,), name="mpslaunch-stops", daemon=True
        ).start()
        try:
            yield
        finally:
            signal.set_wakeup_fd(callers)
            self.stop_clock()
            os.close(write_fd)  # the reader sees end-of-file, and closes the read end

    def drain(self) -> bool:
        """Act on every signal number waiting in the wakeup pipe, in the order the signals came
        (Python runs pending handlers in signal-number order instead); False once it ended."""
        started = False
        with self.lock:
            while self.wakeup is not None:
                try:
                    numbers = os.read(self.wakeup[0], 512)
                except BlockingIOError:
                    break
                if not numbers:
                    self.wakeup = None
                for signum in numbers:
                    if signum in STOPPING_SIGNALS:
                        started = self._stopping(signum) or started
            open_yet = self.wakeup is not None
        self._announce(started)
        return open_yet

    def _read_signals(self, read_fd: int) -> None:
        try:
            while True:
                select.select([read_fd], [], [])
                if not self.drain():
                    return
        finally:
            os.close(read_fd)

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
