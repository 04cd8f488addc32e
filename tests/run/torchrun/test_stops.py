"""How a several-process run stops: the grace period when a rank fails, a second signal while the
first is handled, and what the summary says about each rank; a stop during restarts, in a burst
at start-up, two different signals, the signals that are only passed on, Ctrl-C on ranks that
ignore it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from helpers import Lines, run_cli, wait_for, write_script
from mpslaunch.run.torchrun.outcome import RankFailure, failure_summary
from mpslaunch.run.torchrun.signals import LauncherSignals, Stopped
from test_rendezvous import free_port, machine, wait_until_machine_0_waits
from test_torchrun import processes_with

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses Linux signals")

# Rank 0 takes `save seconds` to save when asked to stop (SIGTERM); rank 1 fails (exit 3) once
# rank 0 is ready.
SAVES_SLOWLY = """
import os, signal, sys, time
from pathlib import Path
folder, save_seconds = Path(sys.argv[1]), float(sys.argv[2])
if os.environ["RANK"] == "0":
    def save(signum, frame):
        (folder / "asked").write_text("")
        time.sleep(save_seconds)
        (folder / "saved").write_text("")
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, save)
    (folder / "ready.0").write_text("")
    while True:
        time.sleep(1)
while not (folder / "ready.0").exists():
    time.sleep(0.05)
sys.exit(3)
"""


@pytest.mark.slow
@pytest.mark.parametrize("grace, save, saved", [
    (1, 20, False),  # torch's own 30 s would let it save
    (60, 31, True),  # torch's own 30 s would kill it mid-save
], ids=["grace-1s-save-20s", "grace-60s-save-31s"])
def test_when_a_rank_fails_the_others_get_the_grace_period_to_stop(tmp_path, grace, save, saved):
    script = write_script(tmp_path, "saves.py", SAVES_SLOWLY)
    result = run_cli("launch", "--cpu", "-q", "--num_processes", "2", "--grace_period", str(grace),
                     str(script), str(tmp_path), str(save), timeout=save + 90)
    assert result.returncode == 3, result.stderr
    assert (tmp_path / "asked").exists()
    assert (tmp_path / "saved").exists() == saved, result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    assert summary.startswith("mpslaunch: rank 1 failed first: it exited with code 3;"), summary
    if saved:
        assert summary.endswith("; rank 0 was stopped"), summary
    else:
        assert summary.endswith(f"; rank 0 did not stop within --grace_period {grace} s and was "
                                "killed (SIGKILL)"), summary


def test_a_rank_that_ended_by_itself_is_not_called_stopped():
    """Rank 0 was killed by SIGKILL on its own (the kernel's OOM killer, say) before the launcher
    stopped anyone: it failed; it was not stopped."""
    first = RankFailure(1, 1, 101, 3, None)
    by_itself = failure_summary(first, {0: -signal.SIGKILL}, stopped=set(), grace_seconds=30)
    assert by_itself.endswith("; rank 0 also failed: it was killed by SIGKILL (exit code 137)")
    told = failure_summary(first, {0: -signal.SIGTERM}, stopped={0}, grace_seconds=30)
    assert told.endswith("; rank 0 was stopped")
    killed = failure_summary(first, {0: -signal.SIGKILL}, stopped={0}, grace_seconds=2.5)
    assert killed.endswith("; rank 0 did not stop within --grace_period 2.5 s and was killed (SIGKILL)")


def test_a_second_stopping_signal_while_the_first_is_handled_raises_nothing():
    """GNU timeout sends SIGTERM twice: the second must not raise while the first unwinds (it
    came from inside the clean-up, as a traceback and exit 1)."""
    from mpslaunch.run.supervisor import SAME_STOP_SECONDS

    with LauncherSignals(30, run_id="no-such-run") as signals:
        with pytest.raises(Stopped), signals.interruptible():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises within the first bytecodes of the sleep
        time.sleep(SAME_STOP_SECONDS)  # past GNU timeout's copy of the first one
        os.kill(os.getpid(), signal.SIGTERM)  # now, during the first one's clean-up
        for _ in range(50):
            time.sleep(0.01)  # a raising handler would raise here
        signals.quiet()
    assert signals.watcher.stopping_signal == signal.SIGTERM


@pytest.mark.slow
def test_sigterms_in_a_burst_during_the_wait_for_the_other_machines_never_give_a_traceback(tmp_path):
    """GNU timeout sends SIGTERM twice; here SIGTERM comes again and again until the launcher
    is gone, so some land while the first one unwinds. It ends stopped by SIGTERM: 143, or
    killed by SIGTERM itself once its handlers are given back at the very end; never exit 1."""
    script = write_script(tmp_path, "never.py", "open(__file__ + '.ran', 'w')\n")
    for _ in range(2):
        port = free_port()
        launcher = subprocess.Popen([sys.executable, "-m", "mpslaunch", *machine(0, port, script)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until_machine_0_waits(port, launcher)
            while launcher.poll() is None:
                launcher.send_signal(signal.SIGTERM)
                time.sleep(0.001)
            _, stderr = launcher.communicate(timeout=60)
        finally:
            launcher.kill()
            launcher.communicate()
        assert launcher.returncode in (143, -signal.SIGTERM), stderr
        assert "Traceback" not in stderr
        assert stderr.strip().splitlines()[-1].startswith(
            "mpslaunch: stopped by SIGTERM while waiting for the other machines")
    assert not Path(f"{script}.ran").exists()


# ---------------------------------------------------------------- stops, through the CLI

TWO_RANKS = ("launch", "--cpu", "-q", "--num_processes", "2")


def start_two_ranks(folder: Path, script: Path, marker: str, *extra: str, quiet: bool = True):
    """The launcher of two ranks running `script <folder>`; every process carries `marker`."""
    args = TWO_RANKS if quiet else tuple(word for word in TWO_RANKS if word != "-q")
    return subprocess.Popen([sys.executable, "-m", "mpslaunch", *args, *extra, str(script),
                             str(folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "MPSLAUNCH_TEST_MARKER": marker})


@pytest.fixture
def marker():
    value = f"MPSLAUNCH_TEST_MARKER=run-{uuid.uuid4().hex}"
    yield value
    for pid in processes_with(value):  # a failing test leaves nothing to the next one
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def launcher_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpslaunch: ")]


# Rank 0 writes a megabyte of lines, then both ranks fail at once. The test does not read the
# launcher's output yet, so torch's log tailer, copying rank 0's lines to the console, blocks,
# and torch's agent, stopping the attempt to restart it, waits in the tailer's stop: where torch's
# `except Exception` would swallow the SignalException its own signal handler raises.
FAILS_AFTER_A_MEGABYTE = """
import os, sys
if os.environ["RANK"] == "0":
    sys.stdout.write(("x" * 99 + "\\n") * 10_000)
sys.exit(3)
"""

# The CLI, with the main thread's stack written to a file, one JSON line of (file, function)
# innermost first, on SIGURG (which the launcher leaves alone). A Python handler runs in the main
# thread, even while it waits for a lock.
WITH_STACK_DUMPS = """
import json, signal, sys, traceback
dumps = sys.argv.pop(1)
def dump(signum, frame):
    with open(dumps, "a") as stream:
        stream.write(json.dumps([(where.filename, where.name)
                                 for where in reversed(traceback.extract_stack(frame))]) + "\\n")
signal.signal(signal.SIGURG, dump)
open(dumps, "a").close()  # ready for SIGURG
from mpslaunch.commands import main
sys.exit(main(sys.argv[1:]))
"""


def main_thread_stack(launcher: subprocess.Popen, dumps: Path) -> list[tuple[str, str]]:
    """The launcher's main thread's stack now, innermost frame first: (file, function)."""
    assert wait_for(dumps.exists, 60), "the launcher never took SIGURG"
    count = len(dumps.read_text().splitlines())
    launcher.send_signal(signal.SIGURG)
    assert wait_for(lambda: len(dumps.read_text().splitlines()) > count, 30), "no stack written"
    return [tuple(frame) for frame in json.loads(dumps.read_text().splitlines()[-1])]


def in_the_tailers_stop(stack: list[tuple[str, str]]) -> bool:
    """Waiting for torch's log tailers to finish, in their stop()."""
    return any(file.endswith("tail_log.py") and function == "stop" for file, function in stack[:4])


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_stop_while_torch_restarts_the_ranks_ends_the_run(tmp_path, marker, signum):
    """The signal lands while torch stops an attempt's ranks to restart them (in its log tailers'
    stop): the run ends, stopped by it, and no rank is left; --max_restarts 1000 would otherwise
    go on for long past the test's patience."""
    script = write_script(tmp_path, "fails.py", FAILS_AFTER_A_MEGABYTE)
    dumps = tmp_path / "stacks"
    launcher = subprocess.Popen(
        [sys.executable, "-c", WITH_STACK_DUMPS, str(dumps), *TWO_RANKS, "--max_restarts", "1000",
         str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "MPSLAUNCH_TEST_MARKER": marker})
    try:
        assert wait_for(lambda: in_the_tailers_stop(main_thread_stack(launcher, dumps)), 90), \
            main_thread_stack(launcher, dumps)
        launcher.send_signal(signum)
        _, stderr = launcher.communicate(timeout=90)
    finally:
        launcher.kill()
    assert launcher.returncode == 128 + signum, stderr[-2000:]
    assert launcher_lines(stderr)[-1] == (
        f"mpslaunch: stopped by {signal.Signals(signum).name}; every rank was stopped "
        f"(exit code {128 + signum})")
    assert processes_with(marker) == []


# Each rank says it is ready, then sleeps.
SLEEPS = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1], f"ready.{os.environ['RANK']}").write_text(str(os.getpid()))
time.sleep(120)
"""


def torch_loaded(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def ranks_exist(pid: int, script: Path) -> bool:
    try:
        return any(str(script) in " ".join(child.cmdline())
                   for child in psutil.Process(pid).children())
    except psutil.Error:
        return False


STAGES = {  # where the burst lands, each seen from outside the launcher
    "torch loaded": lambda launcher, script, folder: torch_loaded(launcher.pid),
    "ranks starting": lambda launcher, script, folder: ranks_exist(launcher.pid, script),
    "ranks running": lambda launcher, script, folder: (folder / "ready.1").exists(),
}


def stopped_by(launcher: subprocess.Popen, stderr: str) -> str:
    """The signal the last line says stopped the run, checked against the exit code."""
    last = launcher_lines(stderr)[-1]
    name = re.match(r"mpslaunch: stopped by (SIG[A-Z]+)", last)
    assert name, last
    assert launcher.returncode == 128 + getattr(signal, name[1]), stderr[-2000:]
    assert last.endswith(f"(exit code {launcher.returncode})"), last
    return name[1]


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_a_burst_of_stop_signals_at_start_up_stops_the_run_and_blames_no_rank(tmp_path, marker, stage):
    """INT, HUP and TERM at once at a given stage of the start: the run stops, whatever torch was
    doing; no rank named as failed, nothing left, and the launcher ends (a grace period of 600 s:
    a rank left to it would hold the launcher past the test's patience). The kernel hands over
    signals pending together lowest number first, so the one that stopped the run is not always
    the first sent; whichever it is, the last line names it and its number is the exit code."""
    script = write_script(tmp_path, "sleeps.py", SLEEPS)
    for burst in range(2):
        folder = tmp_path / f"burst{burst}"
        folder.mkdir()
        launcher = start_two_ranks(folder, script, marker, "--grace_period", "600")
        reached = STAGES[stage]
        assert wait_for(lambda: reached(launcher, script, folder), 90), launcher.poll()  # noqa: B023
        for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            launcher.send_signal(signum)
        _, stderr = launcher.communicate(timeout=90)
        assert stopped_by(launcher, stderr) in ("SIGINT", "SIGHUP", "SIGTERM")
        assert "Traceback" not in stderr and "failed first" not in stderr, stderr[-2000:]
        assert processes_with(marker) == []


# Each rank ignores SIGTERM and SIGINT, says it is ready, and sleeps.
IGNORES_STOPS = """
import os, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
Path(sys.argv[1], f"ready.{os.environ['RANK']}").write_text(str(os.getpid()))
time.sleep(120)
"""


def ranks_ready(folder: Path) -> bool:
    return all((folder / f"ready.{rank}").exists() for rank in (0, 1))


@pytest.mark.slow
@pytest.mark.parametrize("first, then, killed", [
    (signal.SIGINT, signal.SIGINT, "SIGINT came again"),  # Ctrl-C twice
    (signal.SIGTERM, signal.SIGHUP, "SIGHUP came"),  # two different stops
], ids=["ctrl-c-twice", "TERM-then-HUP"])
def test_a_stop_says_the_grace_period_at_once_and_a_second_one_kills_the_ranks(tmp_path, marker,
                                                                               first, then, killed):
    """To ranks that ignore it: at once, one line says the signal was passed on, the grace period,
    and that Ctrl-C again stops now. A second stopping signal (past GNU timeout's window for one
    signal sent twice) kills the ranks now, not after the grace period; the run was stopped by
    the first (128 + it, printed and returned)."""
    from mpslaunch.run.supervisor import SAME_STOP_SECONDS

    script = write_script(tmp_path, "ignores.py", IGNORES_STOPS)
    launcher = start_two_ranks(tmp_path, script, marker, "--grace_period", "600", quiet=False)
    assert wait_for(lambda: ranks_ready(tmp_path), 90), launcher.poll()
    lines = Lines(launcher.stderr)
    launcher.send_signal(first)
    name, code = signal.Signals(first).name, 128 + first
    assert lines.wait_for(f"mpslaunch: {name}") == (
        f"mpslaunch: {name} passed on to every rank; they have 600 s to stop (--grace_period) "
        "before they are killed; Ctrl-C again kills them now")
    time.sleep(SAME_STOP_SECONDS)
    launcher.send_signal(then)
    assert launcher.wait(timeout=90) == code
    assert launcher_lines(lines.rest())[-2] == (  # the last: the end line
        f"mpslaunch: stopped by {name}; {killed} while the ranks were stopping, so those still "
        f"running were killed (exit code {code})")
    assert processes_with(marker) == []


@pytest.mark.slow
def test_two_stop_signals_at_once_give_one_code_printed_and_returned(tmp_path, marker):
    """Sent together, both are pending when the kernel hands them over (lowest number first):
    the one the last line names is the exit code, and the other killed the ranks."""
    script = write_script(tmp_path, "ignores.py", IGNORES_STOPS)
    launcher = start_two_ranks(tmp_path, script, marker, "--grace_period", "600")
    assert wait_for(lambda: ranks_ready(tmp_path), 90), launcher.poll()
    launcher.send_signal(signal.SIGTERM)
    launcher.send_signal(signal.SIGHUP)
    _, stderr = launcher.communicate(timeout=90)
    first = stopped_by(launcher, stderr)
    second = ({"SIGTERM", "SIGHUP"} - {first}).pop()
    assert f"; {second} came while the ranks were stopping, so those still running were killed" \
        in launcher_lines(stderr)[-1]
    assert processes_with(marker) == []


# Each rank notes the signal it got in got.<RANK> and exits 7.
NOTES_A_SIGNAL = """
import os, signal, sys, time
from pathlib import Path
def note(signum, frame):
    Path(sys.argv[1], f"got.{os.environ['RANK']}").write_text(signal.Signals(signum).name)
    sys.exit(7)
for name in sys.argv[2].split(","):
    signal.signal(getattr(signal, name), note)
Path(sys.argv[1], f"ready.{os.environ['RANK']}").write_text(str(os.getpid()))
time.sleep(120)
"""

PASSED_ON = ["SIGALRM", "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGPWR"]


@pytest.mark.slow
@pytest.mark.parametrize("name", PASSED_ON)
def test_signals_that_would_end_the_launcher_reach_every_rank(tmp_path, marker, name):
    """Their default action ends a process: the launcher passes them on instead, so the ranks
    decide (here: note it and exit 7), as they would without the launcher; nothing is orphaned."""
    script = write_script(tmp_path, "notes.py", NOTES_A_SIGNAL)
    launcher = subprocess.Popen([sys.executable, "-m", "mpslaunch", *TWO_RANKS, str(script),
                                 str(tmp_path), name], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "MPSLAUNCH_TEST_MARKER": marker})
    assert wait_for(lambda: ranks_ready(tmp_path), 90), launcher.poll()
    launcher.send_signal(getattr(signal, name))
    _, stderr = launcher.communicate(timeout=90)
    assert launcher.returncode == 7, stderr[-2000:]
    assert [(tmp_path / f"got.{rank}").read_text() for rank in (0, 1)] == [name, name]
    assert processes_with(marker) == []


# Each rank saves for a second when asked to stop (SIGTERM), then exits 143.
SAVES_ON_SIGTERM = """
import os, signal, sys, time
from pathlib import Path
folder, rank = Path(sys.argv[1]), os.environ["RANK"]
def save(signum, frame):
    time.sleep(1)
    (folder / f"saved.{rank}").write_text("")
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, save)
(folder / f"ready.{rank}").write_text(str(os.getpid()))
time.sleep(120)
"""


@pytest.mark.slow
def test_one_signal_sent_twice_at_once_is_one_stop_and_the_ranks_save(tmp_path, marker):
    """GNU timeout sends its signal to the launcher, then to its process group: the ranks get
    their grace period, not a kill at the second copy."""
    script = write_script(tmp_path, "saves.py", SAVES_ON_SIGTERM)
    launcher = start_two_ranks(tmp_path, script, marker)
    assert wait_for(lambda: ranks_ready(tmp_path), 90), launcher.poll()
    launcher.send_signal(signal.SIGTERM)
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=90)
    assert launcher.returncode == 143, stderr[-2000:]
    assert (tmp_path / "saved.0").exists() and (tmp_path / "saved.1").exists(), stderr[-2000:]
    assert launcher_lines(stderr)[-1] == "mpslaunch: stopped by SIGTERM; every rank was stopped (exit code 143)"
    assert processes_with(marker) == []
