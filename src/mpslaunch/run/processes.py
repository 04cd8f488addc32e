"""What both run paths share about child processes: the signals that stop a run, exit codes,
killing a process group, prctl, finding every process a run started (among our children too,
where Linux makes the orphans of a run ours), and the environment a function run here sees.

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
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# Signals whose default action ends a process and that do not stop a run by themselves: passed on
# to the script (every rank), which decides, as it would without the launcher (docs/cli.md:
# Signals). The launcher's own faults (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP)
# are not among them; Python ignores SIGPIPE and SIGXFSZ (a write fails instead).
PASSED_ON = tuple(
    getattr(signal, name)
    for name in (
        "SIGUSR1",
        "SIGUSR2",
        "SIGALRM",
        "SIGVTALRM",
        "SIGPROF",
        "SIGXCPU",
        "SIGPWR",
        "SIGSTKFLT",
    )
    if hasattr(signal, name)
) + (
    (signal.SIGIO, *range(signal.SIGRTMIN, signal.SIGRTMAX + 1)) if sys.platform == "linux" else ()
)
RUN_MARKER = "MPSLAUNCH_RUN_ID"
# Linux shows every environment in /proc, so whether anything still carries a marker is known
# without psutil: a run that left nothing behind never imports it.
MARKS_SEEN_WITHOUT_PSUTIL = sys.platform == "linux"
_CLOCK_SLACK_SECONDS = 2.0  # Linux start times are computed from a boot time in whole seconds


def exit_code(returncode: int) -> int:
    """Popen's -N (killed by signal N) becomes 128+N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


def kill_group(pgid: int) -> bool:
    """SIGKILL a whole process group; whether it was there (one already gone is not an error)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def handled_here(signum: int) -> bool:
    """Whether a run takes `signum` over. Not a signal this process was started with ignored
    (SIGHUP under nohup, SIGINT and SIGQUIT for a non-interactive shell's `&` job): the run keeps
    ignoring it, as `python script.py` would, and the children inherit the SIG_IGN. A signal only
    passed on, only where it would end this process: a caller's own handler stays in charge."""
    if signum in PASSED_ON:
        return signal.getsignal(signum) is signal.SIG_DFL
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
    return any(True for _ in _marked_in_proc(run_id))


def _marked_in_proc(run_id: str) -> Iterator[int]:
    """Linux: the pids (never this one) whose environment in /proc has RUN_MARKER=run_id."""
    entry = f"\0{RUN_MARKER}={run_id}\0".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as stream:
                if entry in b"\0" + stream.read():
                    yield int(name)
        except OSError:
            continue  # gone meanwhile, or another user's


def kill_marked(run_id: str, since: float) -> list[int]:
    """SIGKILL every live process that carries the run's marker and started after `since` (a
    time.time()), wait briefly for them to go, and return their pids. A broken psutil (it fails
    to import, or raises) costs neither the script's exit code nor the clean-up on Linux."""
    try:
        return _kill_marked_with_psutil(run_id, since)
    except Exception as error:  # anything a broken install raises
        return _kill_marked_without_psutil(run_id, error)


def _kill_marked_with_psutil(run_id: str, since: float) -> list[int]:
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


def _kill_marked_without_psutil(run_id: str, error: Exception) -> list[int]:
    """/proc shows the marked processes on Linux; elsewhere psutil alone can, so say so."""
    from mpslaunch.output import error_line, warning

    repair = "reinstall it (pip install --force-reinstall psutil)"
    if not MARKS_SEEN_WITHOUT_PSUTIL:
        warning(
            f"psutil failed ({error_line(error)}), so processes the script left behind may "
            f"still run; {repair}"
        )
        return []
    warning(
        f"psutil failed ({error_line(error)}); the run's processes were found through /proc "
        f"instead; {repair}"
    )
    killed = []
    for _ in range(10):  # a helper may start another one while we kill: a few rounds
        left = list(_marked_in_proc(run_id))
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)  # the marker is the run's own: no reused pid has it
            except OSError:
                pass
        _reap(left, seconds=1.0)
        killed += left
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


def sweep_children(run_id: str, before: set[int]) -> list[int]:
    """SIGKILL what is left of the run among our children and reap it; return the pids.

    What is left: our children that carry the run's marker, in a process group other than
    ours, that is the ranks (each leads its own) and, on Linux, the helpers of ranks that
    already exited, which `adopt_orphans` made our children, each with its whole process group.
    Children that are not the run's (the caller's own, under mpslaunch.launch()) are left alone;
    `before`: the pids of our children when the run started, whose exit statuses are the
    caller's to collect.
    """
    swept = []
    for _ in range(10):  # killing a helper can orphan its own children to us: a few rounds
        left = [
            (pid, pgid)
            for pid, pgid in children()
            if pgid != os.getpgrp() and carries_marker(pid, run_id)
        ]
        if not left:
            break
        for _, pgid in left:
            kill_group(pgid)
        _reap([pid for pid, _ in left])
        swept += [pid for pid, _ in left]
    # Helpers of the ranks that ended on their own after we adopted them: dead, unreadable.
    _reap([pid for pid in zombie_children() if pid not in before], seconds=0)
    return swept


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
    import ctypes  # loaded by linux_prctl already

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


@contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """The ranks (or a function run in this process) see `env`: put it in os.environ for the run,
    then leave os.environ exactly as it was (torch's launcher adds variables of its own too)."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
