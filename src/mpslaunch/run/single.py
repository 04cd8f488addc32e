"""run(plan): the only part with side effects. Starts the child, forwards signals, returns its code.

The child gets a session of its own, so a Ctrl-C in the terminal reaches it once (through us)
rather than twice, and when it ends we can kill whatever it left behind (DataLoader workers) by
its process group. SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded and start a grace period
after which the child's whole group is killed; SIGUSR1 and SIGUSR2 are only forwarded.
On Linux the child also dies if the launcher itself is killed (PR_SET_PDEATHSIG).

Exit code: the child's own; 128+N when signal N killed it (the shell's convention).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence

from mpslaunch.errors import MpslaunchError
from mpslaunch.run.processes import FORWARDED_SIGNALS, STOPPING_SIGNALS, exit_code, kill_group, linux_prctl

DEFAULT_GRACE_SECONDS = 30.0


def run_child(command: Sequence[str], env_additions: Mapping[str, str],
              grace_seconds: float = DEFAULT_GRACE_SECONDS) -> int:
    env = {**os.environ, **env_additions}
    supervisor = _Supervisor(grace_seconds)
    # Handlers go in first: a signal that arrives while the child starts is held, then forwarded.
    with _SignalHandlers(supervisor.forward):
        try:
            child = subprocess.Popen(list(command), env=env, start_new_session=True,
                                     preexec_fn=_parent_death_signal())
        except OSError as error:
            raise MpslaunchError(f"cannot start {command[0]}: {error.strerror}") from None
        supervisor.attach(child)
        returncode = child.wait()
    supervisor.clean_up()
    return exit_code(returncode)


class _Supervisor:
    """Forwards signals to the child and kills its process group when the grace period ends."""

    def __init__(self, grace_seconds: float):
        self.grace_seconds = grace_seconds
        self.child: subprocess.Popen | None = None
        self.held: list[int] = []
        self.kill_timer: threading.Timer | None = None

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
            self.kill_timer = threading.Timer(self.grace_seconds, self.kill_group)
            self.kill_timer.daemon = True
            self.kill_timer.start()

    def kill_group(self) -> None:
        kill_group(self.child.pid)

    def clean_up(self) -> None:
        if self.kill_timer is not None:
            self.kill_timer.cancel()
        # Whatever the child left in its session (workers, helpers) must not outlive the run.
        self.kill_group()


class _SignalHandlers:
    """Installs one handler for every forwarded signal; restores the old ones on exit."""

    def __init__(self, handler):
        self.handler = handler
        self.previous: dict[int, object] = {}

    def __enter__(self):
        for signum in FORWARDED_SIGNALS:
            self.previous[signum] = signal.signal(signum, self.handler)
        return self

    def __exit__(self, *_exc):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def _parent_death_signal():
    """A preexec_fn asking Linux to SIGKILL the child if the launcher dies first; None elsewhere."""
    prctl = linux_prctl()  # loaded before the fork: the child only makes one system call
    if prctl is None:
        return None
    PR_SET_PDEATHSIG = 1
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
