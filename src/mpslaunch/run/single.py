"""The one-process engine: the plan's command as one child, in a session of its own, with signals
forwarded and a grace period (run/supervisor.py).

Its own session means a terminal's Ctrl-C reaches the child once (through us), and whatever it
leaves in its process group (DataLoader workers) can be killed when it ends; what left the group
(setsid helpers) is found by the run's marker (run/processes.py). On Linux the child also dies
with the launcher (PR_SET_PDEATHSIG); its helpers in sessions of their own do not.
With --log_dir its output is also copied to files (run/tee.py).
A signal the launcher was started with ignored (SIGHUP under nohup, SIGINT for a shell's `&`
job) stays ignored, as it would for `python script.py`. Ctrl-Z stops the child and then the
launcher, so the shell's job control works; SIGCONT goes on to the child. A stopping signal is
forwarded once and starts the grace period (one line says so); another one kills the child now.
Exit code: the child's own; 128+N when signal N killed it, or when stopping signal N reached
it and it was killed after the grace period or at a later signal (the run was stopped by N, as
on the torchrun path).
What runs the child (the companion, the supervisor, the process table) is imported by `run`:
--dry_run imports this module for `describe` alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from contextlib import ExitStack

from mpslaunch import output
from mpslaunch.output import MpslaunchError

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on every launch
if TYPE_CHECKING:
    from mpslaunch.plan import LaunchPlan
    from mpslaunch.run.companion import Watch
    from mpslaunch.run.supervisor import Supervisor


def describe(plan: LaunchPlan) -> str:
    """What --dry_run prints: the plan itself."""
    return plan.describe()


def run(plan: LaunchPlan, watch: Watch, held: Sequence[int]) -> int:
    """Run the plan's command as one child; return its exit code. `held`: stopping signals that
    came before the run's handlers (supervisor.holding_stops)."""
    from mpslaunch.run.companion import watching
    from mpslaunch.run.processes import PASSED_ON, STOPPING_SIGNALS, new_run_id

    tee = _tee(plan.log_dir) if plan.log_dir else None
    run_id, started = new_run_id(), time.time()
    child = _Child(run_id, plan.grace_period, plan.delivers_signals, watch.report)
    # The companion is entered once the script has started (nothing of it delays the start)
    # and left after the clean-up, which the run's time and peaks include.
    with ExitStack() as companion_around:
        # Handlers go in first: a signal that arrives while the child starts is held, then
        # forwarded.
        with child.supervisor.handling(
            {
                **dict.fromkeys(STOPPING_SIGNALS + PASSED_ON, child.signal),
                signal.SIGTSTP: child.job_control,
                signal.SIGCONT: child.job_control,
            }
        ):
            if held:  # a stop came before these handlers: the script never starts
                companion = companion_around.enter_context(watching(watch))
                code, returncode = _stopped_before_the_start(held[0], tee), None
            else:
                process = _start(plan, run_id, tee)
                child.attach(process)
                companion = companion_around.enter_context(watching(watch))
                companion.follow(process.pid)
                returncode = _wait(process, tee)
        if returncode is not None:
            code = _after_the_child(child.supervisor, returncode, started, tee)
    companion.ended(code, returncode, str(tee.folder) if tee else None)
    return code


def _start(plan: LaunchPlan, run_id: str, tee) -> subprocess.Popen:
    """The child, in a session of its own, with the plan's environment and the run's marker."""
    from mpslaunch.run.processes import RUN_MARKER

    inherited = {key: value for key, value in os.environ.items() if key not in plan.removed}
    env = {**inherited, **(tee.environment if tee else {}), **plan.env, RUN_MARKER: run_id}
    try:
        return subprocess.Popen(
            list(plan.command),
            env=env,
            start_new_session=True,
            preexec_fn=_parent_death_signal(),
            **(tee.popen_streams if tee else {}),
        )
    except OSError as error:
        raise MpslaunchError(f"cannot start {plan.command[0]}: {error.strerror}") from None


def _wait(process: subprocess.Popen, tee) -> int:
    """The child's Popen returncode, once it ended."""
    from mpslaunch.run.processes import MARKS_SEEN_WITHOUT_PSUTIL, warm_process_table

    if tee:
        tee.start(process)
    if not MARKS_SEEN_WITHOUT_PSUTIL:
        warm_process_table()
    return process.wait()


def _after_the_child(supervisor: Supervisor, returncode: int, started: float, tee) -> int:
    """The clean-up once the child ended, and the run's exit code: the stopping signal's when
    the supervisor had to kill the child."""
    from mpslaunch.run.processes import exit_code

    # Whatever the child left in its session (workers, helpers) or elsewhere must not outlive it.
    supervisor.clean_up(started)
    if tee:
        tee.finish()  # after the kills: a helper holding the output pipe would keep it open
    if supervisor.killed_at is not None and returncode == -signal.SIGKILL:
        code = supervisor.exit_code()
        output.say(
            f"the script was still running {_when_killed(supervisor)}, so it was killed; "
            f"exit code {code}"
        )
        return code
    return exit_code(returncode)


def _stopped_before_the_start(signum: int, tee) -> int:
    if tee:
        tee.finish()
    output.say(
        f"stopped by {signal.Signals(signum).name} before the script started (exit code "
        f"{128 + signum})"
    )
    return 128 + signum


def _when_killed(supervisor: Supervisor) -> str:
    first = signal.Signals(supervisor.stopping_signal).name
    if not supervisor.killed_at:
        return f"{supervisor.grace_seconds:g} s after {first} (--grace_period)"
    if supervisor.killed_at == supervisor.stopping_signal:
        return f"when {first} came again"
    return f"when {signal.Signals(supervisor.killed_at).name} came after {first}"


class _Child:
    """What a signal means for the one child: it is forwarded (held until the child exists); a
    stopping one goes through the supervisor (the first forwarded, with the grace period; a
    later one kills); job control reaches the child while it runs."""

    def __init__(
        self, run_id: str, grace_seconds: float, delivered: bool = False, report: bool = False
    ):
        from mpslaunch.run.processes import STOPPING_SIGNALS
        from mpslaunch.run.supervisor import Supervisor

        self.stopping = STOPPING_SIGNALS  # those the supervisor stops the run with
        self.process: subprocess.Popen | None = None
        self.held: list[int] = []
        self.supervisor = Supervisor(
            run_id,
            grace_seconds,
            self.group,
            delivered=delivered,
            announce=self.announce if report else None,
        )

    def group(self) -> list[int]:
        return [self.process.pid] if self.process is not None else []

    def attach(self, process: subprocess.Popen) -> None:
        self.process = process
        for signum in self.held:  # sent before the child existed: SLURM's did not reach it either
            if signum in self.stopping:
                self.supervisor.stop(signum, missed=True)
            else:
                self.supervisor.send(signum)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int, _frame=None) -> None:
        if self.process is None:
            self.held.append(signum)
        elif self.running() and signum in self.stopping:
            self.supervisor.stop(signum)
        elif self.running():
            self.supervisor.forward(signum)

    def announce(self, signum: int) -> None:
        how = (
            "sent to the script by SLURM"
            if self.supervisor.delivered
            else "passed on to the script"
        )
        output.say(
            f"{signal.Signals(signum).name} {how}; it has "
            f"{self.supervisor.grace_seconds:g} s to stop (--grace_period) before it is "
            "killed; Ctrl-C again kills it now"
        )

    def job_control(self, signum: int, _frame=None) -> None:
        if self.running():
            self.supervisor.job_control(signum)


def _tee(log_dir: str):
    from mpslaunch.run.tee import Tee  # only with --log_dir

    return Tee(log_dir)


def _parent_death_signal():
    """A preexec_fn asking Linux to SIGKILL the child if the launcher dies first; None elsewhere."""
    from mpslaunch.run.processes import linux_prctl

    prctl = linux_prctl()  # loaded before the fork: the child only makes one system call
    if prctl is None:
        return None
    PR_SET_PDEATHSIG = 1
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
