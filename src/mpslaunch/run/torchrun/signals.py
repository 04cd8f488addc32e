"""Signals on the torchrun path, as the supervisor (run/supervisor.py) applies them there.

Until torch's agent owns the ranks, the first stopping signal becomes `Stopped` (128+N, no
traceback; a later one only hurries the kill); the supervisor counts every stopping signal,
whoever handles it, and SIGKILLs the ranks `grace_seconds` after the first, or at once on the
second; SIGUSR1/2 are forwarded to the ranks; Ctrl-Z stops the ranks, then the launcher
(SIGCONT continues them); a signal the launcher was started with ignored (nohup's SIGHUP) stays
ignored, by torch's agent too.

In a SLURM step (`delivered`), SLURM signals every rank itself: nothing is forwarded, and
torch's agent takes over no stopping signal (it would send its own to the ranks), so the
launcher's Stopped ends the agent's run, whose shutdown waits for the ranks (torch_internals.
graceful_stops) instead of signalling them again.
"""

from __future__ import annotations

import signal
from contextlib import ExitStack

from mpslaunch.run.processes import STOPPING_SIGNALS, rank_pids
from mpslaunch.run.supervisor import Supervisor

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
    """The run's handlers and its supervisor (`watcher`); `quiet()` once the ranks are gone."""

    def __init__(self, grace_seconds: float, run_id: str, delivered: bool = False):
        self.stopping = False  # Stopped was raised: the run is ending
        self.watcher = Supervisor(run_id, grace_seconds, lambda: rank_pids(run_id),
                                  second_stop_kills=True, delivered=delivered)
        self.context = ExitStack()

    def __enter__(self) -> LauncherSignals:
        self.context.enter_context(self.watcher.handling({
            **dict.fromkeys(STOPPING_SIGNALS, self._stop),
            **dict.fromkeys(FORWARDED_ONLY, self.watcher.forward),
            **dict.fromkeys(JOB_CONTROL, self.watcher.job_control)}))
        self.context.enter_context(self.watcher.counting_every_signal())
        return self

    def __exit__(self, *exc) -> None:
        self.context.__exit__(*exc)

    def torch_handles(self) -> str:
        """For torch's signals_to_handle: the stopping signals that were not ignored (none when
        SLURM delivers them to the ranks)."""
        return ",".join(signal.Signals(signum).name for signum in STOPPING_SIGNALS
                        if self.watcher.handles(signum) and not self.watcher.delivered)

    def stopped_by_slurm(self) -> bool:
        """A stopping signal that SLURM sent to every rank too has ended the run."""
        return self.stopping and self.watcher.delivered

    def quiet(self) -> None:
        # torch leaves its handlers installed after the run; a late signal must not raise
        # SignalException (or Stopped) in the middle of our clean-up.
        self.stopping = True
        self.watcher.ignore_stops()

    def _stop(self, signum: int, _frame) -> None:
        # Once: a second signal (GNU timeout sends two) must not raise again while the first
        # is being handled; the supervisor has seen it and kills the ranks at once.
        if not self.stopping:
            self.stopping = True
            raise Stopped(signum)
