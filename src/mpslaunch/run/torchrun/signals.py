"""Signals on the torchrun path, as the supervisor (run/supervisor.py) applies them there.

The launcher's handlers stay installed for the whole run: torch's agent installs none
(run/torch_internals.py), because its handlers raise SignalException, an Exception, which torch's
own `except Exception` (the log tailers' stop) swallows while it restarts the ranks. A stopping
signal is seen by the supervisor in the order signals came (the first stops the run, 128+N;
another one kills the ranks now), and it unwinds torch's agent as `Stopped`, a BaseException that
no `except Exception` takes; the agent's own `finally` then stops the ranks with the stop's
signal (supervisor.death_signal) and the grace period. Stopped is raised only where unwinding is
safe: inside `interruptible()` (the wait for other machines, torch's agent), never while torch
starts an attempt's ranks (from its log folders to its first look at them: a context torch
does not hold yet would not be closed), and at the checkpoints between (`check`). SIGUSR1, SIGUSR2
and the other signals only passed on reach the ranks; Ctrl-Z stops the ranks, then the launcher
(SIGCONT continues them); a signal the launcher was started with ignored (nohup's SIGHUP) stays
ignored.

In a SLURM step (`delivered`), SLURM signals every rank itself: nothing is forwarded, and the
agent's shutdown after a stop waits for the ranks (torch_internals.graceful_stops, told by
supervisor.death_signal) instead of signalling them again.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from mpslaunch.run.processes import PASSED_ON, STOPPING_SIGNALS, rank_pids
from mpslaunch.run.supervisor import Supervisor

JOB_CONTROL = (signal.SIGTSTP, signal.SIGCONT)


class Stopped(BaseException):
    """A stopping signal stopped the run; `signum` is the first one, the supervisor's.

    A BaseException, like KeyboardInterrupt, so that torch's `except Exception` (its rendezvous
    retries, its log tailers' stop) does not swallow it; torch's agent still shuts its ranks down
    in its `finally`.
    """

    def __init__(self, signum: int, summary: str = ""):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.summary = summary  # the launcher's last line, when the stop needs its own words


class LauncherSignals:
    """The run's handlers and its supervisor (`watcher`); `quiet()` once the ranks are gone.
    `say`: where the line at the first stop goes (None: --quiet)."""

    def __init__(
        self,
        grace_seconds: float,
        run_id: str,
        say: Callable[[str], None] | None = None,
        delivered: bool = False,
    ):
        self.watcher = Supervisor(
            run_id,
            grace_seconds,
            lambda: rank_pids(run_id),
            forwards_stops=False,
            announce=self._announce if say else None,
            delivered=delivered,
        )
        self.say = say
        self.inside = False  # in an interruptible() region
        self.starting = False  # torch is starting an attempt's ranks
        self.raised = False  # a handler raised Stopped once: later ones only hurry the kill
        self.ended = False  # quiet(): the clean-up runs
        self.ranks_started = False
        self.defer_while_starting = False  # torch_internals tells torch's first look at new ranks
        self.context = ExitStack()

    def __enter__(self) -> LauncherSignals:
        self.context.enter_context(
            self.watcher.handling(
                {
                    **dict.fromkeys(STOPPING_SIGNALS, self._stop),
                    **dict.fromkeys(PASSED_ON, self.watcher.forward),
                    **dict.fromkeys(JOB_CONTROL, self.watcher.job_control),
                }
            )
        )
        self.context.enter_context(self.watcher.counting_every_signal())
        return self

    def __exit__(self, *exc) -> None:
        self.context.__exit__(*exc)

    def quiet(self) -> None:
        # A late signal must not raise Stopped in the middle of our clean-up.
        self.ended = True
        self.watcher.ignore_stops()

    def stopped_by(self) -> int:
        """The signal that stopped the run; 0 while none has."""
        return self.watcher.stopping_signal

    # ---------------------------------------------------------------- where Stopped is raised

    def _stop(self, signum: int, _frame) -> None:
        # The supervisor acts on this signal and every earlier one, in the order they came (or
        # on this one alone, outside the wakeup pipe's time).
        if not self.watcher.drain():
            self.watcher.stop(signum)
        if self.inside and not self.starting and not self.raised and not self.ended:
            self.raised = True
            raise Stopped(self.stopped_by() or signum)

    def check(self) -> None:
        """A checkpoint: raise Stopped if the run was stopped (however the last one ended)."""
        if self.stopped_by() and not self.ended:
            self.raised = True
            raise Stopped(self.stopped_by())

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A region the main thread may be unwound from as soon as a stop comes."""
        self.check()
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    def ranks_starting(self) -> None:
        """torch asks for an attempt's log folders: no ranks after a stop; none raised meanwhile."""
        self.check()
        self.ranks_started = True
        self.starting = self.defer_while_starting

    def safe_point(self) -> None:
        """torch's agent looks at the ranks it holds, or has closed them: unwinding is safe."""
        self.starting = False
        if self.inside:
            self.check()

    def death_signal(self, default: int | None) -> int | None:
        return self.watcher.death_signal(default)

    def _announce(self, signum: int) -> None:
        if self.say is None:  # the supervisor announces only where there is a say
            return
        how = "sent to every rank by SLURM" if self.watcher.delivered else "passed on to every rank"
        self.say(
            f"mpslaunch: {signal.Signals(signum).name} {how}; they have "
            f"{self.watcher.grace_seconds:g} s to stop (--grace_period) before they are "
            "killed; Ctrl-C again kills them now"
        )

    # ---------------------------------------------------------------- function ranks

    def forked(self, function):
        """`function` for ranks forked from this process: each starts with the caller's handlers."""
        return _ForkedRank(function, self.watcher)


class _ForkedRank:
    def __init__(self, function, watcher: Supervisor):
        self.function, self.watcher = function, watcher
        self.__name__ = getattr(function, "__name__", type(function).__name__)
        self.__qualname__ = getattr(
            function, "__qualname__", self.__name__
        )  # torch names ranks by it

    def __call__(self, *args):
        self.watcher.forget_in_child()
        return self.function(*args)
