"""Memory pressure while the run lasts: the decision on described readings (macOS and Linux),
the sampling thread driven by described readings, and one real run on Linux where a child reads
far more than a memory cgroup lets it keep, so the machine waits on memory."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from helpers import write_script
from mpslaunch.run import memory_watch
from mpslaunch.run.memory_watch import (MACOS_CRITICAL, MACOS_WARNING, MemoryWatch, PressureJudge,
                                        Reading, hard_swapping)

GB, MB = 2**30, 2**20
TOTAL = 16 * GB


def mac(at: float, available: float = 6 * GB, swapped_in: float = 0, level: int = 1) -> Reading:
    return Reading(at, int(available), TOTAL, int(swapped_in), pressure_level=level)


def linux(at: float, available: float = 6 * GB, swapped_in: float = 0, stall_s: float | None = 0.0) -> Reading:
    return Reading(at, int(available), TOTAL, int(swapped_in),
                   stall_us=None if stall_s is None else int(stall_s * 1e6))


# ---------------------------------------------------------------- the decision


def test_macos_critical_pressure_is_hard_swapping_whatever_the_numbers():
    assert hard_swapping(mac(0), mac(5, level=MACOS_CRITICAL)) == "macOS reports critical memory pressure"


def test_macos_warning_counts_only_with_fast_page_ins():
    assert hard_swapping(mac(0), mac(5, swapped_in=50 * MB, level=MACOS_WARNING)) is None  # 10 MB/s
    why = hard_swapping(mac(0), mac(5, swapped_in=500 * MB, level=MACOS_WARNING))
    assert why == "macOS reports memory pressure, 100 MB/s paged in"


def test_macos_page_ins_at_normal_pressure_are_not_swapping():
    """psutil's swap-in on macOS counts every page-in (a memory-mapped dataset too): the
    kernel's level must agree before anything is said."""
    assert hard_swapping(mac(0), mac(5, available=0.2 * GB, swapped_in=5 * GB, level=1)) is None


def test_linux_time_spent_waiting_for_memory_is_hard_swapping_when_little_is_left():
    assert hard_swapping(linux(0), linux(5, available=GB, stall_s=0.2)) is None  # 4 % of the time
    why = hard_swapping(linux(0), linux(5, available=GB, stall_s=1.5))
    assert why == "processes waited for memory 30% of the time"


@pytest.mark.parametrize("swap_total", [0, 2 * GB])
def test_waits_for_memory_with_memory_to_spare_are_not_this_runs(swap_total):
    """20 of 23.5 GB available while some process (another container at its limit) waits for
    memory a fifth of the time: the machine is neither short of memory nor swapping."""
    def plenty(at: float, stall_s: float) -> Reading:
        return Reading(at, 20 * GB, int(23.5 * GB), 0, stall_us=int(stall_s * 1e6),
                       swap_total=swap_total)

    judge = PressureJudge("cpu")
    assert [judge.observe(plenty(5 * i, i * 1.0)) for i in range(5)] == [None] * 5
    assert hard_swapping(linux(0), linux(5, available=5 * GB, swapped_in=GB, stall_s=3)) is None


def test_linux_fast_swap_in_counts_only_when_memory_is_short():
    assert hard_swapping(linux(0), linux(5, swapped_in=GB)) is None  # plenty left
    why = hard_swapping(linux(0), linux(5, available=0.5 * GB, swapped_in=GB, stall_s=None))
    assert why == "205 MB/s swapped in"
    assert hard_swapping(linux(0), linux(5, available=0.5 * GB, swapped_in=10 * MB)) is None  # slow


def test_readings_out_of_order_or_at_the_same_time_say_nothing():
    assert hard_swapping(linux(5), linux(5, stall_s=4)) is None
    assert hard_swapping(linux(5), linux(4, stall_s=4)) is None


def test_one_line_with_what_to_change_then_silence_for_a_few_minutes():
    judge = PressureJudge("mps")
    readings = [mac(0)] + [mac(5 * i, available=0.3 * GB, level=MACOS_CRITICAL) for i in range(1, 70)]
    lines = [(r.at, line) for r in readings if (line := judge.observe(r))]
    assert [at for at, _ in lines] == [5, 305]  # the first, then one per WARN_EVERY_SECONDS
    text = lines[0][1]
    assert text == ("the machine is swapping hard (macOS reports critical "
                    "memory pressure; 307 MB of 16.0 GB available), which slows training down "
                    "many times; use a smaller batch size, a lower mps_memory_cap in the profile "
                    "(torch then stops at the cap), or fewer DataLoader workers (num_workers)")


def test_mps_memory_cap_is_only_suggested_on_mps():
    judge = PressureJudge("cpu")
    judge.observe(linux(0))
    line = judge.observe(linux(5, available=GB, stall_s=2))
    assert line and "mps_memory_cap" not in line and "smaller batch size, or fewer DataLoader workers" in line


def test_without_swap_the_line_says_short_of_memory_not_swapping():
    """A machine with no swap at all whose processes wait for memory (page cache reclaimed) is
    not swapping: the line says what is true, with no swap figure."""
    def no_swap(at: float, stall_s: float) -> Reading:
        return Reading(at, int(1.5 * GB), int(23.5 * GB), 0, stall_us=int(stall_s * 1e6),
                       swap_total=0)

    judge = PressureJudge("cpu")
    judge.observe(no_swap(0, 0))
    line = judge.observe(no_swap(5, 1.0))
    assert line == ("the machine is short of memory (processes waited for memory 20% of the "
                    "time; 1.5 GB of 23.5 GB available), which slows training down many times; "
                    "use a smaller batch size, or fewer DataLoader workers (num_workers)")
    with_swap = Reading(5, GB, TOTAL, 0, stall_us=10**6, swap_total=2 * GB)
    assert memory_watch.warning_line("x", with_swap, "cpu").startswith("the machine is swapping hard (x; ")


def test_calm_readings_never_warn():
    judge = PressureJudge("mps")
    assert not any(judge.observe(mac(5 * i, swapped_in=i * MB)) for i in range(100))


# ---------------------------------------------------------------- the sampling thread


def test_the_thread_judges_described_readings_and_stops_when_asked(monkeypatch):
    monkeypatch.setattr(memory_watch, "SAMPLE_SECONDS", 0.0)
    readings = iter([mac(0), mac(5), mac(10, level=MACOS_CRITICAL), mac(15, level=MACOS_CRITICAL)]
                    + [mac(20 + i) for i in range(10_000)])
    said, done = [], threading.Event()

    def read():
        reading = next(readings)
        if reading.at >= 40:
            done.set()
        return reading

    class Follower:
        ticks = 0

        def tick(self):
            Follower.ticks += 1

    watch = MemoryWatch("mps", said.append, followers=[Follower()], interval=0.001, read=read)
    watch.start()
    assert done.wait(30)
    watch.stop()
    assert not watch.thread.is_alive()
    assert len(said) == 1 and "critical memory pressure" in said[0]
    assert Follower.ticks >= 4


def test_a_reading_that_hangs_delays_neither_the_ticks_nor_the_stop():
    """A sysctl that never answers: the followers (the peak memory) are still sampled, and
    stopping the watch does not wait for the reading."""
    hang, ticked = threading.Event(), threading.Semaphore(0)

    class Follower:
        def tick(self):
            ticked.release()

    watch = MemoryWatch("mps", print, followers=[Follower()], interval=0.01,
                        read=lambda: hang.wait(60))
    watch.start()
    for _ in range(5):
        assert ticked.acquire(timeout=30)
    began = time.monotonic()
    watch.stop()
    assert time.monotonic() - began < 1.0
    assert not watch.thread.is_alive() and watch.reader.is_alive()  # the reading still hangs
    hang.set()


def test_a_reading_that_fails_does_not_end_the_watch(monkeypatch):
    monkeypatch.setattr(memory_watch, "SAMPLE_SECONDS", 0.0)
    calls = threading.Semaphore(0)

    def read():
        calls.release()
        raise OSError("no /proc here")

    watch = MemoryWatch("cpu", print, interval=0.001, read=read)
    watch.start()
    for _ in range(3):
        assert calls.acquire(timeout=30)
    watch.stop()


def test_a_real_reading_of_this_machine():
    reading = memory_watch.read_memory()
    assert 0 < reading.available <= reading.total and reading.swapped_in >= 0
    if sys.platform == "linux" and Path("/proc/pressure/memory").exists():
        assert reading.stall_us is not None and reading.pressure_level is None


# ---------------------------------------------------------------- a real run under a memory limit

LIMIT = 96 * MB  # the launcher and its child live in it, with room for neither the data
# Joins the memory cgroup given, writes a file far larger than the cgroup may keep in memory, and
# reads it through mmap again and again until told to stop: every pass faults it back in, and
# the kernel counts the time spent waiting for that memory.
THRASH = """
import mmap, os, sys, time
from pathlib import Path
cgroup, folder = Path(sys.argv[1]), Path(sys.argv[2])
(cgroup / "cgroup.procs").write_text(str(os.getpid()))
size = 256 << 20
with open(folder / "data.bin", "wb") as stream:
    block = os.urandom(1 << 20)
    for _ in range(size >> 20):
        stream.write(block)
data = mmap.mmap(os.open(folder / "data.bin", os.O_RDONLY), size, prot=mmap.PROT_READ)
deadline = time.monotonic() + 240
while not (folder / "stop").exists() and time.monotonic() < deadline:
    total = 0
    for offset in range(0, size, 4096):
        total += data[offset]
print("stopped" if (folder / "stop").exists() else "gave up")
"""


def memory_cgroup() -> Path:
    """A new memory cgroup with a limit of LIMIT bytes, or pytest.skip with the reason."""
    if sys.platform != "linux":
        pytest.skip("memory cgroups are Linux's")
    if not Path("/proc/pressure/memory").exists():
        pytest.skip("this kernel reports no memory pressure (/proc/pressure/memory)")
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    name = f"mpslaunch-test-{uuid.uuid4().hex[:8]}"
    for root, limit_files in ((Path("/sys/fs/cgroup"), ("memory.max", "memory.swap.max")),
                              (Path("/sys/fs/cgroup/memory"), ("memory.limit_in_bytes",))):
        if root == Path("/sys/fs/cgroup") and "memory" not in _read(root / "cgroup.subtree_control"):
            continue
        if not (root / "cgroup.procs").exists():
            continue
        group = root / name
        try:
            group.mkdir()
            for limit in limit_files:
                (group / limit).write_text(str(0 if "swap" in limit else LIMIT))
            return group
        except OSError as error:
            if group.exists():
                group.rmdir()
            last = error
    pytest.skip(f"no writable memory cgroup here (cgroup v2 without the memory controller, "
                f"or {locals().get('last', 'no v1 memory hierarchy')})")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.fixture
def limited():
    group = memory_cgroup()
    yield group
    for _ in range(100):  # the child is gone once the launcher returned; the kernel lags a little
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def in_group(group: Path) -> list[str]:
    """A command prefix that runs the command in the memory cgroup `group` (as a container's
    processes run in theirs)."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group)]


@pytest.mark.slow
def test_a_run_past_its_memory_limit_gets_one_warning(tmp_path, limited):
    """The launcher and its child in a memory cgroup (a container's limit): what is left under
    the limit is short, and the child waits for memory."""
    import psutil

    # The line says swapping only where the machine has swap (this one may have none).
    state = "is swapping hard" if psutil.swap_memory().total else "is short of memory"
    expected = f"mpslaunch: warning: the machine {state} ("
    script = write_script(tmp_path, "thrash.py", THRASH)
    launcher = subprocess.Popen([*in_group(limited), sys.executable, "-m", "mpslaunch", "launch",
                                 "--cpu", str(script), str(limited), str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    warnings, deadline = [], time.monotonic() + 180
    try:
        while not warnings and time.monotonic() < deadline:
            ready, _, _ = select.select([launcher.stderr], [], [], 1.0)
            line = launcher.stderr.readline() if ready else ""
            if line.startswith("mpslaunch: warning: the machine "):
                warnings.append(line)
    finally:
        (tmp_path / "stop").write_text("")
    stdout, rest = launcher.communicate(timeout=120)
    assert warnings, "no warning while the child thrashed"
    assert launcher.returncode == 0 and stdout == "stopped\n", rest
    assert warnings[0].startswith(expected), warnings[0]
    assert "processes waited for memory" in warnings[0] and "smaller batch size" in warnings[0]
    assert "mpslaunch: warning: the machine " not in rest  # one line only
    assert rest.strip().splitlines()[-1].startswith("mpslaunch: ended after ")


@pytest.mark.slow
def test_quiet_runs_no_watch(tmp_path, limited):
    script = write_script(tmp_path, "thrash.py", THRASH)
    (tmp_path / "stop").write_text("")  # one pass, then stop
    result = subprocess.run([*in_group(limited), sys.executable, "-m", "mpslaunch", "launch",
                             "--cpu", "-q", str(script), str(limited), str(tmp_path)],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0 and result.stderr == ""


# Waits until the neighbour (THRASH, outside the run) has thrashed for a while, then says so.
WAITS_FOR_THE_NEIGHBOUR = """
import sys, time
from pathlib import Path
time.sleep(float(sys.argv[1]))
print("calm")
"""


@pytest.mark.slow
def test_a_neighbour_past_its_memory_limit_gives_this_run_no_warning(tmp_path, limited):
    """Another group thrashes against its own limit (the machine's waits for memory rise) while
    this run, with the machine's memory to spare, trains calmly: nothing is said."""
    neighbour = subprocess.Popen([sys.executable, "-c", THRASH, str(limited), str(tmp_path)],
                                 stdout=subprocess.PIPE, text=True)
    try:
        script = write_script(tmp_path, "calm.py", WAITS_FOR_THE_NEIGHBOUR)
        ran = subprocess.run([sys.executable, "-m", "mpslaunch", "launch", "--cpu", str(script),
                              "15"], capture_output=True, text=True, timeout=120)
    finally:
        (tmp_path / "stop").write_text("")
        neighbour.communicate(timeout=120)
    assert ran.returncode == 0 and ran.stdout == "calm\n", ran.stderr
    assert "warning" not in ran.stderr, ran.stderr


@pytest.mark.parametrize("layout, files, expected", [
    ("v2", {"memory.max": "1073741824\n", "memory.current": "1000000000\n"}, (73741824, 2**30)),
    ("v2", {"memory.max": "max\n", "memory.current": "1000000000\n"}, None),
    ("v1", {"memory.limit_in_bytes": "100663296\n", "memory.usage_in_bytes": "100700000\n"},
     (0, 100663296)),
    ("v1", {"memory.limit_in_bytes": "9223372036854771712\n", "memory.usage_in_bytes": "5\n"}, None),
    ("v2", {}, None),
])
def test_what_a_memory_limit_leaves_is_read_from_its_files(tmp_path, layout, files, expected):
    """Described control groups: a limit, none ("max", v1's huge number), files missing."""
    from mpslaunch.machine import limits

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert limits._limit_at(str(tmp_path), limits._LAYOUTS[layout]) == expected


def test_a_run_under_a_memory_limit_reads_what_the_limit_leaves(monkeypatch):
    monkeypatch.setattr(memory_watch.machine, "memory_limit_left", lambda: (5 * MB, 96 * MB))
    reading = memory_watch.read_memory()
    assert (reading.available, reading.total) == (5 * MB, 96 * MB)
