"""What both run paths share about child processes: the signals that stop a run, exit codes,
killing a process group, prctl, and finding every process a run started.

Every process of a run carries RUN_MARKER=<the run's id> in its environment, inherited from the
child the launcher starts; after the run, whatever still carries it is killed, wherever it went
(its own session, reparented to init or launchd). psutil reads the environments on Linux and
macOS alike (on macOS not those of Apple's own signed programs: docs/mps-facts.md: Training on a
Mac). psutil is imported only when used, after the child has started.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
FORWARDED_SIGNALS = STOPPING_SIGNALS + (signal.SIGUSR1, signal.SIGUSR2)
RUN_MARKER = "MPSLAUNCH_RUN_ID"
# Linux shows every environment in /proc, so whether anything still carries a marker is known
# without psutil: a run that left nothing behind never imports it.
MARKS_SEEN_WITHOUT_PSUTIL = sys.platform == "linux"
_CLOCK_SLACK_SECONDS = 2.0  # Linux start times are computed from a boot time in whole seconds


def exit_code(returncode: int) -> int:
    """Popen's -N (killed by signal N) becomes 128+N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group; one that is already gone is not an error."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def handled_here(signum: int) -> bool:
    """False for a signal this process was started with ignored (SIGHUP under nohup, SIGINT and
    SIGQUIT for a non-interactive shell's `&` job): the run keeps ignoring it, as `python
    script.py` would, and the children inherit the SIG_IGN."""
    return signal.getsignal(signum) is not signal.SIG_IGN


def stop_with(signum: int, groups: list[int]) -> None:
    """Job control for children in sessions of their own. SIGTSTP: stop their process groups
    (SIGSTOP: the kernel drops a SIGTSTP sent to a group outside the terminal's session), then
    this process, as the shell expects of a job; SIGCONT: continue the groups."""
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGSTOP if signum == signal.SIGTSTP else signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass
    if signum == signal.SIGTSTP:
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once the shell continues us (fg, bg)


def new_run_id() -> str:
    return os.urandom(8).hex()


def warm_process_table() -> None:
    """Import psutil and read the process table once while the child runs: psutil keeps what it
    read, so the scan after the run reads only what is new and the launcher exits sooner."""
    import psutil

    for _ in psutil.process_iter():
        pass


def may_be_marked(run_id: str) -> bool:
    """Whether a process may still carry the run's marker (False only when none does, which
    Linux tells from /proc without psutil); kill_marked then finds them."""
    if not MARKS_SEEN_WITHOUT_PSUTIL:
        return True
    entry = f"\0{RUN_MARKER}={run_id}\0".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as stream:
                if entry in b"\0" + stream.read():
                    return True
        except OSError:
            continue  # gone meanwhile, or another user's
    return False


def kill_marked(run_id: str, since: float) -> list[int]:
    """SIGKILL every live process that carries the run's marker and started after `since` (a
    time.time()), wait briefly for them to go, and return their pids."""
    import psutil

    killed = []
    for _ in range(10):  # a helper may start another one while we kill: a few rounds
        left = marked_processes(run_id, since)
        if not left:
            break
        for process in left:
            try:
                process.kill()  # psutil checks first that the pid was not reused
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=1.0)
        killed += [process.pid for process in left]
    return killed


def marked_processes(run_id: str, since: float) -> list:
    """Live psutil.Process objects (never this one) whose environment has RUN_MARKER=run_id."""
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if process.pid == os.getpid() or process.create_time() < since - _CLOCK_SLACK_SECONDS:
                continue
            if process.environ().get(RUN_MARKER) == run_id:
                found.append(process)
        except psutil.Error:
            continue  # gone meanwhile, a zombie, or another user's
    return found


def linux_prctl():
    """libc's prctl on Linux (for parent-death signals and subreapers); None elsewhere."""
    if sys.platform != "linux":
        return None
    import ctypes  # only here: the launcher's start-up pays for it only on Linux

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


@contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """The ranks (or a function run in this process) see `env`: put it in os.environ for the run."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
