"""The output path under faults, one and two processes: a long line without a newline, --log_dir
on a full disk or a path that cannot be a folder, stdout or stderr closed or unwritable.

What holds: the script starts and its exit code comes back; its output is always drained (it
never blocks on a pipe); the console and the files get what they can take, with one warning
when the files cannot; the launcher's own lines never go to stdout; a signal still stops the run.
Real runs through the CLI; a full disk is a real 1 MiB tmpfs (root only).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import file_line, read_only_disk, small_disk as mounted_small_disk, write_script
from mpslaunch.run.torchrun.console import MAX_HELD
from test_faults import marker, one_line_error, run_env  # noqa: F401 (fixture)

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and uses Linux signals"),
              pytest.mark.slow]

MPSLAUNCH = [sys.executable, "-m", "mpslaunch"]
TWO_CPU_RANKS = ["--cpu", "--num_processes", "2"]


def shell(redirections: str, *args: str, marker: str, cwd: Path) -> subprocess.CompletedProcess:
    """`mpslaunch ARGS REDIRECTIONS` run by bash, as a cron line or a daemon would run it."""
    return subprocess.run(["bash", "-c", f'exec "$@" {redirections}', "bash", *MPSLAUNCH, *args],
                          capture_output=True, text=True, timeout=120, env=run_env(marker), cwd=cwd)


def start(*args: str, marker: str, stderr: Path) -> tuple[subprocess.Popen, "Lines"]:
    """`mpslaunch ARGS` with its stdout read line by line and its stderr in a file."""
    with stderr.open("w") as errors:
        launcher = subprocess.Popen([*MPSLAUNCH, *args], stdout=subprocess.PIPE, stderr=errors,
                                    text=True, env=run_env(marker))
    return launcher, Lines(launcher.stdout)


def ended(launcher: subprocess.Popen, stderr: Path) -> str:
    launcher.wait(timeout=60)
    return stderr.read_text()


class Lines:
    """A process's stdout read line by line in a thread, so a test can wait for one."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self.arrived = threading.Condition()
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self.arrived:
                self.lines.append(line)
                self.arrived.notify_all()

    def wait_for(self, start: str, timeout: float = 60) -> None:
        with self.arrived:
            found = self.arrived.wait_for(lambda: any(line.startswith(start) for line in self.lines),
                                          timeout)
        assert found, f"no line starting with {start!r} within {timeout} s: {self.lines[-3:]}"

    def text(self) -> str:
        self.reader.join(30)
        return "".join(self.lines)


# ---------------------------------------------------------------- a long line without a newline


LONG_LINE = 300_000
# Rank 0 writes a long line without its end, and ends it once told to; rank 1 only waits.
WRITES_A_LONG_LINE = f"""
import os, sys, time
from pathlib import Path
go = Path(sys.argv[1])
if os.environ["RANK"] == "0":
    sys.stdout.write("x" * {LONG_LINE})
    sys.stdout.flush()
while not go.exists():
    time.sleep(0.05)
if os.environ["RANK"] == "0":
    print(" end")
"""


@pytest.mark.parametrize("then", ["the-line-ends", "SIGTERM"])
def test_a_long_line_without_a_newline_reaches_the_console_as_it_comes(tmp_path, marker, then):
    """The console shows it in bounded pieces as it arrives (run/torchrun/console.py), and the
    launcher, never stuck splitting it, finishes the line or answers SIGTERM with 143."""
    script = write_script(tmp_path, "long_line.py", WRITES_A_LONG_LINE)
    launcher, stdout = start("launch", "-q", *TWO_CPU_RANKS, str(script), str(tmp_path / "go"),
                             marker=marker, stderr=tmp_path / "stderr")
    stdout.wait_for("[rank0] xxxx")  # long before the line ends
    if then == "SIGTERM":
        launcher.send_signal(signal.SIGTERM)
    else:
        (tmp_path / "go").write_text("go\n")
    stderr = ended(launcher, tmp_path / "stderr")
    assert launcher.returncode == (143 if then == "SIGTERM" else 0), stderr
    assert "Traceback" not in stderr
    shown = [line.removeprefix("[rank0] ") for line in stdout.text().splitlines()
             if line.startswith("[rank0] x")]
    assert all(len(piece) <= MAX_HELD + len(" end") for piece in shown)
    if then == "the-line-ends":
        assert "".join(shown) == "x" * LONG_LINE + " end"


# Each rank writes MB megabytes to stdout in 1 MB writes, without a single newline (argv[1] = MB).
WRITES_MEGABYTES = """
import sys
for _ in range(int(sys.argv[1])):
    sys.stdout.write("x" * 1_000_000)
sys.stdout.flush()
"""


def launcher_peak_mb(*args: str, marker: str) -> float:
    """The launcher's own peak resident memory (VmHWM), read until it exits; its console is
    /dev/null."""
    from mpslaunch.machine import peak_resident_bytes

    launcher = subprocess.Popen([*MPSLAUNCH, *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=run_env(marker))
    peak = 0
    while launcher.poll() is None:
        peak = max(peak, peak_resident_bytes(launcher.pid) or 0)
        time.sleep(0.02)
    assert launcher.wait(timeout=120) == 0, launcher.stderr.read()[-2000:]
    return peak / 2**20


def test_two_ranks_writing_100_mb_without_a_newline_leave_the_launchers_memory_bounded(
        tmp_path, marker):
    """torch's tailer reads in pieces of MAX_HELD for the run, so what the ranks write without a
    newline never sits in the launcher whole: its peak is that of a run writing 1 MB."""
    script = write_script(tmp_path, "megabytes.py", WRITES_MEGABYTES)
    small = launcher_peak_mb("launch", "-q", *TWO_CPU_RANKS, str(script), "1", marker=marker)
    large = launcher_peak_mb("launch", "-q", *TWO_CPU_RANKS, str(script), "100", marker=marker)
    assert large - small < 100, (small, large)  # whole reads: 2 x 100 MB and copies of them


# ---------------------------------------------------------------- a helper holding the output

# The script leaves a helper in a session of its own, with an environment of its own (so nothing
# finds it), holding stdout and stderr until <argv[1]> exists (or its folder is gone: pytest may
# remove it before a helper on a loaded machine looks); then it says it trained and ends.
LEAVES_A_HELPER_ON_ITS_OUTPUT = """
import subprocess, sys
waits = ("import os, sys, time\\ngo = sys.argv[1]\\n"
         "while os.path.isdir(os.path.dirname(go)) and not os.path.exists(go): time.sleep(0.05)")
subprocess.Popen([sys.executable, "-c", waits, sys.argv[1]], start_new_session=True, env={})
print("trained")
"""


def test_with_log_dir_the_copying_ends_with_the_script_though_a_helper_holds_its_output(tmp_path):
    """In-process: once the script has ended, Tee.finish copies what it wrote and the copying
    stops; it never waits for the helper to close the pipes."""
    from mpslaunch.run.tee import Tee

    script = write_script(tmp_path, "helper.py", LEAVES_A_HELPER_ON_ITS_OUTPUT)
    tee = Tee(str(tmp_path / "logs"))
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path / "go")],
                             env={**os.environ, **tee.environment}, **tee.popen_streams)
    try:
        tee.start(child)
        assert child.wait(timeout=60) == 0
        tee.finish()
        assert not any(copy.is_alive() for copy in tee.copies)  # the helper still holds the pipes
        assert (tee.folder / "stdout.log").read_text() == "trained\n"
    finally:
        (tmp_path / "go").write_text("go\n")


def test_with_log_dir_the_launch_ends_with_the_script_though_a_helper_holds_its_output(
        tmp_path, marker):
    script = write_script(tmp_path, "helper.py", LEAVES_A_HELPER_ON_ITS_OUTPUT)
    try:
        ran = subprocess.run([*MPSLAUNCH, "launch", "--cpu", "--log_dir", str(tmp_path / "logs"),
                              str(script), str(tmp_path / "go")], capture_output=True, text=True,
                             timeout=60, env=run_env(marker))
    finally:
        (tmp_path / "go").write_text("go\n")  # the helper ends only after the launcher did
    assert ran.returncode == 0 and ran.stdout == "trained\n", ran.stderr
    (folder,) = (tmp_path / "logs").iterdir()
    assert (folder / "stdout.log").read_text() == "trained\n"
    assert ran.stderr.strip().splitlines()[-1].startswith("mpslaunch: ended after ")


# ---------------------------------------------------------------- --log_dir on a full disk


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs: a script's 2.4 MB of output fills it for real."""
    with mounted_small_disk(tmp_path / "small-disk", "1m") as folder:
        yield folder


# Prints 2.4 MB, says it is ready, then waits (the given seconds) to be stopped.
PRINTS_A_LOT = """
import sys, time
from pathlib import Path
for i in range(30_000):
    print(f"line {i:06d} " + "y" * 68)
sys.stdout.flush()
Path(sys.argv[1]).write_text("ready\\n")
time.sleep(float(sys.argv[2]))
"""


def test_one_process_on_a_full_disk_warns_once_and_goes_on_on_the_console(tmp_path, full_disk, marker):
    script = write_script(tmp_path, "prints.py", PRINTS_A_LOT)
    launcher, stdout = start("launch", "-q", "--log_dir", str(full_disk), str(script),
                             str(tmp_path / "ready"), "120", marker=marker,
                             stderr=tmp_path / "stderr")
    file_line(tmp_path / "ready", 60)  # the script was never blocked on its output
    launcher.send_signal(signal.SIGTERM)
    stderr = ended(launcher, tmp_path / "stderr")
    assert launcher.returncode == 143, stderr
    assert "Traceback" not in stderr
    warnings = stderr.strip().splitlines()
    assert len(warnings) == 1 and "disk is full" in warnings[0], stderr
    assert str(full_disk) in warnings[0] and "stdout.log" in warnings[0]
    assert stdout.text().count("\n") == 30_000  # the console got everything


def test_two_processes_on_a_full_disk_the_summary_says_the_disk_is_full(tmp_path, full_disk, marker):
    """torch writes the ranks' output to their files: their writes fail, they exit 1, and the
    summary says why instead of pointing at an empty stderr.log."""
    script = write_script(tmp_path, "prints.py", PRINTS_A_LOT)
    result = subprocess.run([*MPSLAUNCH, "launch", "-q", *TWO_CPU_RANKS, "--log_dir", str(full_disk),
                             str(script), str(tmp_path / "ready"), "0"],
                            capture_output=True, text=True, timeout=120, env=run_env(marker))
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    assert "failed first" in summary and "is full" in summary, summary
    assert "is in" not in summary  # no pointer to the empty stderr.log


# ---------------------------------------------------------------- closed or failing streams


# Says it started, prints far more than a pipe holds, exits 5.
STARTS_PRINTS_EXITS_5 = """
import sys
from pathlib import Path
Path(sys.argv[1]).write_text("started\\n")
for _ in range(3000):
    print("z" * 99)
sys.exit(5)
"""


@pytest.mark.parametrize("processes, log_dir, redirections", [
    (1, True, ">&-"),
    (2, False, ">&-"),
    (2, True, ">&-"),
    (1, False, "2>/dev/full"),
    (1, True, "2>/dev/full"),
    (2, False, "2>/dev/full"),
], ids=["1-log_dir-stdout-closed", "2-stdout-closed", "2-log_dir-stdout-closed",
        "1-stderr-full", "1-log_dir-stderr-full", "2-stderr-full"])
def test_closed_or_full_standard_streams_still_run_the_script(tmp_path, marker, processes,
                                                              log_dir, redirections):
    script = write_script(tmp_path, "prints.py", STARTS_PRINTS_EXITS_5)
    options = ["launch", "--num_processes", str(processes), "--cpu"]
    if log_dir:
        options += ["--log_dir", str(tmp_path / "logs")]
    result = shell(redirections, *options, str(script), str(tmp_path / "started"),
                   marker=marker, cwd=tmp_path)
    assert (tmp_path / "started").read_text() == "started\n"
    assert result.returncode == 5, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "Exception" not in result.stderr
    if log_dir and processes == 1:
        (run,) = (tmp_path / "logs").iterdir()
        assert (run / "stdout.log").read_text().count("\n") == 3000


@pytest.mark.parametrize("processes", [1, 2])
def test_with_stderr_closed_the_launchers_lines_stay_off_stdout(tmp_path, marker, processes):
    """stdout is the script's data: the plan line and the failure summary must not land in it."""
    script = write_script(tmp_path, "prints.py", STARTS_PRINTS_EXITS_5)
    result = shell("2>&-", "launch", "--cpu", "--num_processes", str(processes), str(script),
                   str(tmp_path / "started"), marker=marker, cwd=tmp_path)
    assert result.returncode == 5
    lines = result.stdout.splitlines()
    assert [line for line in lines if not line.endswith("z" * 99)] == []
    assert len(lines) >= 3000  # with 2, the other rank is stopped once the first exits 5


# ---------------------------------------------------------------- --log_dir that is no folder


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize("where", ["a-file", "/proc/x"])
def test_a_log_dir_that_cannot_be_a_folder_is_one_line(tmp_path, processes, where):
    script = write_script(tmp_path, "ok.py", "print('ran')\n")
    (tmp_path / "a-file").write_text("not a folder\n")
    result = subprocess.run([*MPSLAUNCH, "launch", "-q", "--cpu", "--num_processes", str(processes),
                             "--log_dir", where, str(script)],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    line = one_line_error(result)
    assert where in line and "--log_dir" in line
    assert "ran" not in result.stdout


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_log_dir_on_a_read_only_disk_says_so(tmp_path, processes):
    """A read-only tmpfs (root only): the system's own reason, not "Permission denied"."""
    script = write_script(tmp_path, "train.py", "print('trained')\n")
    with read_only_disk(tmp_path / "ro") as place:
        for log_dir in (place, place / "logs"):
            for dry_run in ((), ("--dry_run",)):
                refused = subprocess.run(
                    [*MPSLAUNCH, "launch", "--cpu", *dry_run, "--num_processes", processes,
                     "--log_dir", str(log_dir), str(script)], capture_output=True, text=True,
                    timeout=60)
                line = one_line_error(refused)
                assert f"cannot write the output to {log_dir}: Read-only file system" in line, line
