"""Memory pressure while a run lasts: the machine's memory read every few seconds from outside
the script, and one warning line when the machine starts swapping hard (or, on a machine
without swap, runs short of memory).

On unified memory a batch that does not fit does not fail: the Mac swaps and training slows
down many times without a word. What counts as swapping hard (`hard_swapping`, pure):
- macOS: the kernel's memory-pressure level is critical, or it is at warning while pages come
  back from disk fast (psutil's swap-in there counts every page-in, so it needs the level too);
- Linux: while little memory is left (a tenth), processes waited for memory a tenth of the time
  since the last reading (pressure stall information), or swap-in is fast. The waits are the
  whole machine's: with memory to spare they are another group's (a container at its limit),
  not this run's. What is left is the machine's, or less under the run's own memory limit (its
  control group's: a container's `--memory`).
At most one line per WARN_EVERY_SECONDS. The readings cost a few file reads (on macOS one
`sysctl` call) per interval, in a daemon thread of their own: a reading that hangs delays
neither the followers' ticks (the peak memory) nor the end of the run.
"""

from __future__ import annotations

import threading
import time

from mpslaunch import Record, machine, record

SAMPLE_SECONDS = 5.0
WARN_EVERY_SECONDS = 300.0
SWAP_IN_HARD = 20 * 2**20  # bytes per second coming back from swap: far above idle paging
STALL_HARD = 0.10  # share of the time some process waited for memory
LOW_AVAILABLE = 0.10  # share of the memory still available
MACOS_WARNING, MACOS_CRITICAL = 2, 4  # kern.memorystatus_vm_pressure_level


@record
class Reading(Record):
    at: float  # time.monotonic() of the reading
    available: int  # bytes a new allocation can use
    total: int
    swapped_in: int  # bytes swapped (on macOS: paged) in since boot
    pressure_level: int | None = None  # macOS only
    stall_us: int | None = None  # Linux only: microseconds some process waited for memory
    swap_total: int | None = None  # bytes of swap the machine has now; 0: none at all


def read_memory() -> Reading:
    import psutil

    memory, swap = psutil.virtual_memory(), psutil.swap_memory()
    available, total = memory.available, memory.total
    limit = machine.memory_limit_left()
    if limit and limit[1] < total:  # the run's own limit is the tighter one
        available, total = min(available, limit[0]), limit[1]
    return Reading(
        time.monotonic(),
        available,
        total,
        swap.sin,
        machine.memory_pressure_level(),
        machine.memory_stall_microseconds(),
        swap.total,
    )


def hard_swapping(before: Reading, now: Reading) -> str | None:
    """What shows the machine swapping hard between two readings, in words; None if it does not."""
    seconds = now.at - before.at
    if seconds <= 0:
        return None
    swap_rate = max(0, now.swapped_in - before.swapped_in) / seconds
    if now.pressure_level is not None:  # macOS: the kernel's own verdict decides
        if now.pressure_level >= MACOS_CRITICAL:
            return "macOS reports critical memory pressure"
        if now.pressure_level >= MACOS_WARNING and swap_rate >= SWAP_IN_HARD:
            return f"macOS reports memory pressure, {_size(swap_rate)}/s paged in"
        return None
    if now.available >= LOW_AVAILABLE * now.total:  # memory to spare: the waits are not this run's
        return None
    if now.stall_us is not None and before.stall_us is not None:
        stalled = (now.stall_us - before.stall_us) / (seconds * 1e6)
        if stalled >= STALL_HARD:
            return f"processes waited for memory {stalled:.0%} of the time"
    if swap_rate >= SWAP_IN_HARD:
        return f"{_size(swap_rate)}/s swapped in"
    return None


def warning_line(why: str, now: Reading, device: str) -> str:
    cap = (
        ", a lower mps_memory_cap in the profile (torch then stops at the cap)"
        if device == "mps"
        else ""
    )
    # Without swap the waits are page-cache reclaim, not swapping: say only what is true.
    state = "is short of memory" if now.swap_total == 0 else "is swapping hard"
    return (
        f"the machine {state} ({why}; {_size(now.available)} of "
        f"{_size(now.total)} available), which slows training down many times; use a "
        f"smaller batch size{cap}, or fewer DataLoader workers (num_workers)"
    )


class PressureJudge:
    """Readings in, at most one warning line per WARN_EVERY_SECONDS out."""

    def __init__(self, device: str):
        self.device = device
        self.previous: Reading | None = None
        self.warned_at: float | None = None

    def observe(self, reading: Reading) -> str | None:
        before, self.previous = self.previous, reading
        why = hard_swapping(before, reading) if before else None
        if why is None:
            return None
        if self.warned_at is not None and reading.at - self.warned_at < WARN_EVERY_SECONDS:
            return None
        self.warned_at = reading.at
        return warning_line(why, reading, self.device)


class MemoryWatch:
    """Two daemon threads: every `interval` seconds `tick()` of each follower, and every
    SAMPLE_SECONDS a reading judged by PressureJudge, whose warning goes to `say`. stop() waits
    for the ticks only, never for a reading that hangs (a sysctl that does not answer)."""

    STOP_WAIT_SECONDS = 5.0  # for a tick in progress; a reading is not waited for

    def __init__(self, device: str, say, followers=(), interval: float = 1.0, read=read_memory):
        self.judge, self.say, self.read = PressureJudge(device), say, read
        self.followers, self.interval = list(followers), interval
        self.stopping = threading.Event()
        self.thread = threading.Thread(
            target=self._tick_loop, name="mpslaunch-memory-watch", daemon=True
        )
        self.reader = threading.Thread(
            target=self._reading_loop, name="mpslaunch-memory-reading", daemon=True
        )

    def start(self) -> None:
        self.thread.start()
        self.reader.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(self.STOP_WAIT_SECONDS)

    def _tick_loop(self) -> None:
        while True:
            for follower in self.followers:
                follower.tick()
            if self.stopping.wait(self.interval):
                return

    def _reading_loop(self) -> None:
        # The first reading waits an interval: the script starts first, not psutil's import.
        if self.stopping.wait(self.interval):
            return
        while not self.stopping.is_set():
            line = self._judge()
            if line and not self.stopping.is_set():
                self.say(line)
            if self.stopping.wait(max(SAMPLE_SECONDS, self.interval)):
                return

    def _judge(self) -> str | None:
        try:
            return self.judge.observe(self.read())
        except Exception:  # a reading that fails (a sandbox without /proc) must not end the run
            return None


def _size(count: float) -> str:
    for unit, scale, digits in (("GB", 2**30, 1), ("MB", 2**20, 0)):
        if count >= scale:
            return f"{count / scale:.{digits}f} {unit}"
    return f"{count / 2**10:.0f} KB"
