"""run_child: one process, in a session of its own, with signals forwarded and a grace period.

Its own session means a terminal's Ctrl-C reaches the child once (through us), and whatever it
leaves in its process group (DataLoader workers) can be killed when it ends; what left the group
(setsid helpers) is found by the run's marker (run/processes.py). On Linux the child also dies
with the launcher (PR_SET_PDEATHSIG); its helpers in sessions of their own do not.
With --log_dir its output is also copied to files (run/tee.py).
A signal the launcher was started with ignored (SIGHUP under nohup, SIGINT for a shell's `&`
job) stays ignored, as it would for `python script.py`. Ctrl-Z stops the child and then the
launcher, so the shell's job control works; SIGCONT goes on to the child.
Exit code: the child's own; 128+N when signal N killed it, or when stopping signal N reached
it and it was killed after the grace period (the run was stopped by N, as on the torchrun path).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence

from mpslaunch import output
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import DEFAULT_GRACE_SECONDS
from mpslaunch.run.companion import Watch, watching
from mpslaunch.run.processes import (FORWARDED_SIGNALS, MARKS_SEEN_WITHOUT_PSUTIL, RUN_MARKER,
                                     STOPPING_SIGNALS, exit_code, handled_here, kill_group,
                                     kill_marked, linux_prctl, may_be_marked, new_run_id,
                                     stop_with, warm_process_table)


def run_child(command: Sequence[str], env_additions: Mapping[str, str],
              grace_seconds: float = DEFAULT_GRACE_SECONDS, log_dir: str | None = None,
              watch: Watch | None = None, env_removals: Iterable[str] = ()) -> int:
    with watching(watch) as run:
        code, returncode, tee = _run_child(command, env_additions, grace_seconds, log_dir, run,
                                           env_removals)
    run.ended(code, returncode, str(tee.folder) if tee else None)
    return code


def _run_child(command, env_additions, grace_seconds, log_dir, run, env_removals):
    """The run itself: (the exit code, the child's Popen returncode, the Tee or None)."""
    tee = _tee(log_dir) if log_dir else None
    run_id, started = new_run_id(), time.time()
    inherited = {key: value for key, value in os.environ.items() if key not in set(env_removals)}
    env = {**inherited, **(tee.environment if tee else {}), **env_additions, RUN_MARKER: run_id}
    supervisor = _Supervisor(grace_seconds)
    # Handlers go in first: a signal that arrives while the child starts is held, then forwarded.
    with _SignalHandlers(supervisor.forward, supervisor.job_control):
        try:
            child = subprocess.Popen(list(command), env=env, start_new_session=True,
                                     preexec_fn=_parent_death_signal(),
                                     **(tee.popen_streams if tee else {}))
        except OSError as error:
            raise MpslaunchError(f"cannot start {command[0]}: {error.strerror}") from None
        supervisor.attach(child)
        run.follow(child.pid)
        if tee:
            tee.start(child)
        if not MARKS_SEEN_WITHOUT_PSUTIL:
            warm_process_table()
        returncode = child.wait()
    supervisor.clean_up()
    if may_be_marked(run_id):
        kill_marked(run_id, started)  # helpers that left the child's session
    if tee:
        tee.finish()  # after the kills: a helper holding the output pipe would keep it open
    if supervisor.killed_after_grace and returncode == -signal.SIGKILL:
        code = 128 + supervisor.stopping_signal
        output.say(f"the script was still running {grace_seconds:g} s after "
                   f"{signal.Signals(supervisor.stopping_signal).name} (--grace_period), so it was "
                   f"killed; exit code {code}")
        return code, returncode, tee
    return exit_code(returncode), returncode, tee


class _Supervisor:
    """Forwards signals to the child and kills its process group when the grace period ends."""

    def __init__(self, grace_seconds: float):
        self.grace_seconds = grace_seconds
        self.child: subprocess.Popen | None = None
        self.held: list[int] = []
        self.kill_timer: threading.Timer | None = None
        self.stopping_signal = 0  # the first stopping signal forwarded
        self.killed_after_grace = False

    def attach(self, child: subprocess.Popen) -> None:
        self.child = child
        for signum in self.held:
            self.forward(signum)

    def forward(self, signum: int, _frame=None) -> None:
        if self.child is None:
            self.held.append(signum)
            return
        if self.child.poll() is not None:
            return
        try:
            os.kill(self.child.pid, signum)
        except ProcessLookupError:
            return
        if signum in STOPPING_SIGNALS and self.kill_timer is None:
            self.stopping_signal = signum
            self.kill_timer = threading.Timer(self.grace_seconds, self._grace_over)
            self.kill_timer.daemon = True
            self.kill_timer.start()

    def job_control(self, signum: int, _frame=None) -> None:
        """Ctrl-Z (SIGTSTP) and SIGCONT: the child's group, in a session of its own, would not
        see them (the kernel drops a terminal stop sent to such a group)."""
        if self.child is not None and self.child.poll() is None:
            stop_with(signum, [self.child.pid])

    def _grace_over(self) -> None:
        self.killed_after_grace = self.child.poll() is None
        self.kill_group()

    def kill_group(self) -> None:
        kill_group(self.child.pid)

    def clean_up(self) -> None:
        if self.kill_timer is not None:
            self.kill_timer.cancel()
        # Whatever the child left in its session (workers, helpers) must not outlive the run.
        self.kill_group()


class _SignalHandlers:
    """Installs one handler for every forwarded signal (but not over an inherited SIG_IGN) and
    one for job control; restores the old ones on exit."""

    def __init__(self, handler, job_control):
        self.handlers = {**dict.fromkeys(FORWARDED_SIGNALS, handler),
                         signal.SIGTSTP: job_control, signal.SIGCONT: job_control}
        self.previous: dict[int, object] = {}

    def __enter__(self):
        # Only the main thread may handle signals (mpslaunch.launch from a thread): there the
        # signals go to the caller, and the child is still stopped with its group at the end.
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self.handlers.items():
                if handled_here(signum):
                    self.previous[signum] = signal.signal(signum, handler)
        return self

    def __exit__(self, *_exc):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def _tee(log_dir: str):
    from mpslaunch.run.tee import Tee  # only with --log_dir

    return Tee(log_dir)


def _parent_death_signal():
    """A preexec_fn asking Linux to SIGKILL the child if the launcher dies first; None elsewhere."""
    prctl = linux_prctl()  # loaded before the fork: the child only makes one system call
    if prctl is None:
        return None
    PR_SET_PDEATHSIG = 1
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
