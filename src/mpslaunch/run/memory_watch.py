"""Memory pressure while a run lasts: the machine's memory read every few seconds from outside
the script, and one warning line when the machine starts swapping hard.

On unified memory a batch that does not fit does not fail: the Mac swaps and training slows
down many times without a word. What counts as swapping hard (`hard_swapping`, pure):
- macOS: the kernel's memory-pressure level is critical, or it is at warning while pages come
  back from disk fast (psutil's swap-in there counts every page-in, so it needs the level too);
- Linux: processes waited for memory a tenth of the time since the last reading (pressure stall
  information), or swap-in is fast while little memory is left.
At most one line per WARN_EVERY_SECONDS. The readings cost a few file reads (on macOS one
`sysctl` call) per interval, in a daemon thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from mpslaunch import machine

SAMPLE_SECONDS = 5.0
WARN_EVERY_SECONDS = 300.0
SWAP_IN_HARD = 20 * 2**20  # bytes per second coming back from swap: far above idle paging
STALL_HARD = 0.10  # share of the time some process waited for memory
LOW_AVAILABLE = 0.10  # share of the memory still available
MACOS_WARNING, MACOS_CRITICAL = 2, 4  # kern.memorystatus_vm_pressure_level


@dataclass(frozen=True)
class Reading:
    at: float  # time.monotonic() of the reading
    available: int  # bytes a new allocation can use
    total: int
    swapped_in: int  # bytes swapped (on macOS: paged) in since boot
    pressure_level: int | None = None  # macOS only
    stall_us: int | None = None  # Linux only: microseconds some process waited for memory


def read_memory() -> Reading:
    import psutil

    memory, swap = psutil.virtual_memory(), psutil.swap_memory()
    return Reading(time.monotonic(), memory.available, memory.total, swap.sin,
                   machine.memory_pressure_level(), machine.memory_stall_microseconds())


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
    if now.stall_us is not None and before.stall_us is not None:
        stalled = (now.stall_us - before.stall_us) / (seconds * 1e6)
        if stalled >= STALL_HARD:
            return f"processes waited for memory {stalled:.0%} of the time"
    if swap_rate >= SWAP_IN_HARD and now.available < LOW_AVAILABLE * now.total:
        return f"{_size(swap_rate)}/s swapped in"
    return None


def warning_line(why: str, now: Reading, device: str) -> str:
    cap = ", a lower mps_memory_cap in the profile (torch then stops at the cap)" if device == "mps" else ""
    return (f"the machine is swapping hard ({why}; {_size(now.available)} of "
            f"{_size(now.total)} available), which slows training down many times; use a "
            f"smaller batch size{cap}, or fewer DataLoader workers (num_workers)")


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
    """A daemon thread: every `interval` seconds, `tick()` of each follower, and every
    SAMPLE_SECONDS a reading judged by PressureJudge; a warning goes to `say`."""

    def __init__(self, device: str, say, followers=(), interval: float = 1.0, read=read_memory):
        self.judge, self.say, self.read = PressureJudge(device), say, read
        self.followers, self.interval = list(followers), interval
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="mpslaunch-memory-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()

    def _loop(self) -> None:
        # The first reading waits an interval: the script starts first, not psutil's import.
        next_reading = time.monotonic() + self.interval
        while True:
            for follower in self.followers:
                follower.tick()
            if time.monotonic() >= next_reading:
                next_reading = time.monotonic() + SAMPLE_SECONDS
                line = self._judge()
                if line:
                    self.say(line)
            if self.stopping.wait(self.interval):
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
