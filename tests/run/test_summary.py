"""The end of a run: one line with the time, the exit code, the peak memory and where the output
went; native crashes named with the signal and the fault handler's stack, on one process and
on two. The exit codes stay the script's own."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys

import pytest

from helpers import REPO, run_cli, write_script
from mpslaunch.run import summary
from mpslaunch.run.summary import PeakTracker, end_line, native_crash

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and Linux signals")

MB = 2**20
END = re.compile(r"^mpslaunch: ended after (\d+\.\d) s, exit code (\d+)(.*)$")


def no_core_dumps() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def launch(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpslaunch", "launch", *args], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=no_core_dumps,
                          env={**os.environ, **(env or {})})


def last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


def megabytes(text: str, label: str) -> int:
    found = re.search(rf"(\d+(?:\.\d+)?) (MB|GB) {label}", text)
    assert found, text
    return int(float(found.group(1)) * (1024 if found.group(2) == "GB" else 1))


# ---------------------------------------------------------------- the line, from its parts


def test_the_line_from_its_parts():
    assert end_line(3.25, 0, 300 * MB, None, None) == "ended after 3.2 s, exit code 0; peak memory 300 MB"
    assert end_line(4000, 3, 3 * 2**30, 5 * 2**30, "/logs/x") == (
        "ended after 1 h 06 min, exit code 3; peak memory 3.00 GB in the largest rank, "
        "5.00 GB all ranks together; output in /logs/x")
    assert end_line(75, 0, None, None, None) == "ended after 1 min 15 s, exit code 0"


def test_on_macos_the_line_says_which_memory_it_counts():
    assert end_line(3, 0, 8 * 2**30, None, None, measure=summary.FOOTPRINT) == (
        "ended after 3.0 s, exit code 0; peak memory footprint 8.00 GB, GPU included")
    assert end_line(3, 0, 3 * 2**30, 5 * 2**30, None, measure=summary.FOOTPRINT) == (
        "ended after 3.0 s, exit code 0; peak memory footprint 3.00 GB in the largest rank, "
        "5.00 GB all ranks together, GPU included")
    assert end_line(3, 0, 300 * MB, None, None, measure=summary.RESIDENT_ON_MAC) == (
        "ended after 3.0 s, exit code 0; peak resident memory 300 MB (the GPU's memory not "
        "included: macOS's footprint could not be read)")


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGABRT])
def test_native_crash_signals_are_named(signum):
    name = signal.Signals(signum).name
    assert native_crash(-signum, True, "cpu") == (
        f"the script was killed by {name}: a crash in native code; the Python stack above is "
        "from the fault handler (PYTHONFAULTHANDLER)")
    assert native_crash(-signum, False, "cuda") == f"the script was killed by {name}: a crash in native code"
    assert native_crash(-signum, True, "mps").endswith(
        "; known causes on mps: docs/mps-facts.md, \"Native crashes on mps\", in mpslaunch's repository")


@pytest.mark.parametrize("returncode", [0, 1, 134, -signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT])
def test_other_endings_are_not_crashes(returncode):
    assert native_crash(returncode, True, "mps") is None


def test_the_mps_causes_section_exists():
    assert "\n## Native crashes on mps\n" in (REPO / "docs" / "mps-facts.md").read_text()


def test_peaks_of_several_processes_largest_and_together(monkeypatch):
    readings = {1: [100, 300], 2: [50, 500]}  # pid -> what each tick reads
    tick = iter(range(2))
    tracker = PeakTracker(lambda: [1, 2])
    for index in tick:
        monkeypatch.setattr(summary, "_peak_of", lambda pid: readings.get(pid, [0, 0])[index] * MB)
        tracker.tick()
    monkeypatch.setattr(summary, "largest_rss", lambda: 0)
    assert tracker.result() == (500 * MB, 800 * MB)


# ---------------------------------------------------------------- through the CLI, one process

ALLOCATE = """
import sys
block = bytearray(int(sys.argv[1]) * 2**20)
block[::4096] = b"x" * len(block[::4096])
sys.exit(int(sys.argv[2]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("code", [0, 3])
def test_one_process_ends_with_its_time_code_and_peak(tmp_path, code):
    script = write_script(tmp_path, "alloc.py", ALLOCATE)
    result = launch("--cpu", str(script), "300", str(code))
    assert result.returncode == code  # unchanged
    found = END.match(last_line(result))
    assert found and found.group(2) == str(code), result.stderr
    peak = re.search(r"; peak memory (\d+) MB$", last_line(result))
    assert peak and 300 <= int(peak.group(1)) < 600, last_line(result)


@pytest.mark.slow
def test_the_peak_is_the_scripts_even_when_the_launcher_comes_from_a_big_process(tmp_path):
    """A process forked from a large one keeps that size as its own rusage peak: a launcher
    started from a big notebook or test runner must still report its script's peak."""
    script = write_script(tmp_path, "alloc.py", ALLOCATE)
    big_parent = ("import subprocess, sys; block = bytearray(700 * 2**20); "
                  "block[::4096] = b'x' * len(block[::4096]); "
                  "sys.exit(subprocess.run(sys.argv[1:]).returncode)")
    result = subprocess.run([sys.executable, "-c", big_parent, sys.executable, "-m", "mpslaunch",
                             "launch", "--cpu", str(script), "300", "0"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    peak = re.search(r"; peak memory (\d+) MB$", last_line(result))
    assert peak and 300 <= int(peak.group(1)) < 600, last_line(result)


@pytest.mark.slow
def test_the_line_says_where_log_dir_wrote(tmp_path):
    script = write_script(tmp_path, "alloc.py", ALLOCATE)
    result = launch("--cpu", "--log_dir", str(tmp_path / "logs"), str(script), "1", "0")
    (folder,) = (tmp_path / "logs").iterdir()
    assert last_line(result).endswith(f"; output in {folder}")
    assert (folder / "stderr.log").read_text() == ""  # the launcher's lines are not the script's


@pytest.mark.slow
def test_quiet_prints_nothing_of_its_own(tmp_path):
    script = write_script(tmp_path, "alloc.py", ALLOCATE)
    result = launch("--cpu", "-q", str(script), "1", "5")
    assert result.returncode == 5 and result.stderr == ""


# ---------------------------------------------------------------- native crashes, for real

CRASHES = {"segfault": ("import ctypes; ctypes.string_at(0)", signal.SIGSEGV),
           "abort": ("import os; os.abort()", signal.SIGABRT)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(CRASHES))
def test_a_native_crash_shows_the_python_stack_and_the_signal(tmp_path, kind):
    body, signum = CRASHES[kind]
    script = write_script(tmp_path, "crash.py", "def train():\n    " + body + "\ntrain()\n")
    result = launch("--cpu", str(script))
    assert result.returncode == 128 + signum
    assert "Fatal Python error" in result.stderr  # the fault handler's stack
    assert f'File "{script}", line 2 in train' in result.stderr
    name = signal.Signals(signum).name
    assert last_line(result).endswith(
        f"; the script was killed by {name}: a crash in native code; the Python stack above is "
        "from the fault handler (PYTHONFAULTHANDLER)")


@pytest.mark.slow
def test_a_user_who_turned_the_fault_handler_off_gets_no_stack_and_no_claim(tmp_path):
    script = write_script(tmp_path, "crash.py", CRASHES["segfault"][0])
    result = launch("--cpu", str(script), env={"PYTHONFAULTHANDLER": ""})
    assert result.returncode == 139 and "Fatal Python error" not in result.stderr
    assert last_line(result).endswith("; the script was killed by SIGSEGV: a crash in native code")


@pytest.mark.slow
def test_an_exit_code_like_a_signal_is_not_called_a_crash(tmp_path):
    script = write_script(tmp_path, "exit.py", "import sys; sys.exit(139)")
    result = launch("--cpu", str(script))
    assert result.returncode == 139 and "killed by" not in result.stderr


@pytest.mark.slow
def test_the_dry_run_shows_the_fault_handler(tmp_path):
    script = write_script(tmp_path, "train.py", "")
    assert "  PYTHONFAULTHANDLER=1\n" in run_cli("launch", "--dry-run", "--cpu", str(script)).stdout
    kept = run_cli("launch", "--dry-run", "--cpu", str(script), env={"PYTHONFAULTHANDLER": "0"})
    assert "PYTHONFAULTHANDLER" not in kept.stdout


# ---------------------------------------------------------------- two processes

# Rank 1 holds more than the launcher itself (torch is loaded there), so its peak is exact; each
# rank holds its memory for several of the launcher's one-second samples.
RANKS = """
import os, sys, time
rank = int(os.environ["RANK"])
block = bytearray((200, 800)[rank] * 2**20)
block[::4096] = b"x" * len(block[::4096])
time.sleep(5)
if sys.argv[1] == str(rank):
    import ctypes
    ctypes.string_at(0)
"""


@pytest.mark.slow
def test_two_processes_end_with_the_largest_rank_and_the_sum(tmp_path):
    script = write_script(tmp_path, "ranks.py", RANKS)
    result = launch("--cpu", "--num_processes", "2", str(script), "none")
    assert result.returncode == 0, result.stderr[-2000:]
    line = last_line(result)
    assert END.match(line), line
    largest, together = (megabytes(line, label) for label in ("in the largest rank", "all ranks together"))
    assert 800 <= largest < 1400 and largest + 200 <= together < 2000, line


@pytest.mark.slow
def test_a_rank_that_crashes_in_native_code_is_named(tmp_path):
    script = write_script(tmp_path, "ranks.py", RANKS)
    result = launch("--cpu", "--num_processes", "2", str(script), "1")
    assert result.returncode == 139, result.stderr[-2000:]
    assert "[rank1] Fatal Python error: Segmentation fault" in result.stderr
    assert ("mpslaunch: rank 1 failed first: it was killed by SIGSEGV (exit code 139): a crash in "
            "native code; the Python stack above is from the fault handler (PYTHONFAULTHANDLER); "
            "its stderr") in result.stderr
    assert END.match(last_line(result)).group(2) == "139"
