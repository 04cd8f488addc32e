"""The end of a run: one line with the elapsed time, the exit code, the peak memory of the
script's processes and where --log_dir wrote; and what a native crash means.

Each process's peak is sampled every second while it runs. On macOS it is the peak memory
footprint, which counts the GPU's memory (footprint.py); where that cannot be read, the line
says it gives the resident size. On Linux it is VmHWM, and the largest is exact when it is
larger than the launcher itself: getrusage(RUSAGE_CHILDREN) keeps the largest ru_maxrss of every
child the launcher waited for (kilobytes), DataLoader workers included. On CUDA the GPU's own
memory is not in it: no peak of it can be read from outside the script without a driver call
per sample. The sum of the ranks' peaks can miss growth in their last second.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
from collections.abc import Callable, Iterable

from mpslaunch import machine

RESIDENT = "resident"  # Linux: VmHWM and the children's ru_maxrss
FOOTPRINT = "footprint"  # macOS: the peak physical footprint, GPU memory included
RESIDENT_ON_MAC = "resident on macOS"  # macOS where the footprint cannot be read

# How a process dies when native code fails: a bad address, a bus error, an illegal instruction,
# or an abort (a failed assertion in a Metal, CUDA or C++ kernel, std::terminate).
NATIVE_CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGABRT)
MPS_CRASH_CAUSES = 'docs/mps-facts.md, "Native crashes on mps", in mpslaunch\'s repository'


def largest_rss() -> int:
    """The largest resident size of any child this process has waited for, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class PeakTracker:
    """The peak memory of each process `processes()` names, sampled at each tick().

    Finding the processes can cost a scan of the process table (the ranks among the launcher's
    children), so the list is asked again only every REFRESH_SECONDS, or while it is empty, or
    once one of them is gone. `measure` says what the figures are (RESIDENT, FOOTPRINT or
    RESIDENT_ON_MAC)."""

    REFRESH_SECONDS = 5.0

    def __init__(self, processes: Callable[[], Iterable[int]], footprints=None):
        self.processes = processes
        self.footprints = footprints
        self._measure: str | None = None
        self.peaks: dict[int, int] = {}
        self.largest_together = 0  # the most the processes alive at once held, summed
        self.rusage_before = largest_rss()
        self.known: list[int] = []
        self.asked_at = -self.REFRESH_SECONDS

    @property
    def measure(self) -> str:
        """Decided at the first tick, after the script started: on macOS it loads libproc
        through ctypes (footprint.py), which the start need not wait for."""
        if self._measure is None:
            on_mac = os.uname().sysname == "Darwin"
            if self.footprints is None and on_mac:
                from mpslaunch.run import footprint

                self.footprints = footprint.reader()
            if self.footprints is not None and self.footprints.available:
                self._measure = FOOTPRINT
            else:
                self._measure = RESIDENT_ON_MAC if on_mac else RESIDENT
        return self._measure

    def tick(self) -> None:
        if not self.known or time.monotonic() - self.asked_at >= self.REFRESH_SECONDS:
            self.known, self.asked_at = list(self.processes()), time.monotonic()
        alive = []
        for pid in self.known:
            peak = self._peak_of(pid)
            if peak:
                self.peaks[pid] = max(self.peaks.get(pid, 0), peak)
                alive.append(pid)
        if len(alive) < len(self.known):
            self.known = []  # one is gone: ask again at the next tick
        self.largest_together = max(self.largest_together, sum(self.peaks[pid] for pid in alive))

    def result(self) -> tuple[int | None, int | None]:
        """(the largest process's peak, the sum of the ranks' peaks or None for one process)."""
        exact = 0
        if self.measure == RESIDENT:
            after = largest_rss()
            # A forked child starts out with the launcher's resident size (Linux keeps that as
            # its peak at exec), and an earlier child may have been larger: only more than both
            # is ours. (Not RUSAGE_SELF: the launcher's own holds the size of whatever process
            # forked it.)
            exact = after if after > max(self.rusage_before, _peak_of(os.getpid()) or 0) else 0
        largest = max(exact, *self.peaks.values(), 0) or None
        several = len(self.peaks) > 1
        return largest, (max(self.largest_together, largest or 0) if several else None)

    def _peak_of(self, pid: int) -> int | None:
        if self.measure == FOOTPRINT:
            return self.footprints.peak(pid)
        return _peak_of(pid)


def _peak_of(pid: int) -> int | None:
    peak = machine.peak_resident_bytes(pid)
    if peak is not None or sys.platform == "linux":
        return peak
    import psutil  # macOS keeps no resident peak another process can read: the size now

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return None


def native_crash(returncode: int, fault_handler: bool, device: str) -> str | None:
    """What the one process's death by a native-crash signal means (Popen's -N for signal N)."""
    meaning = crash_meaning(returncode, fault_handler)
    if meaning is None:
        return None
    text = f"the script was killed by {signal.Signals(-returncode).name}: {meaning}"
    if device == "mps":
        text += f"; known causes on mps: {MPS_CRASH_CAUSES}"
    return text


def crash_meaning(returncode: int, fault_handler: bool) -> str | None:
    if -returncode not in NATIVE_CRASH_SIGNALS:
        return None
    if not fault_handler:
        return "a crash in native code"
    return "a crash in native code; the Python stack above is from the fault handler (PYTHONFAULTHANDLER)"


def end_line(
    elapsed: float,
    code: int,
    largest: int | None,
    total: int | None,
    log_folder: str | None,
    crash: str | None = None,
    measure: str = RESIDENT,
) -> str:
    parts = [f"ended after {_duration(elapsed)}, exit code {code}"]
    if largest:
        parts.append(_memory(largest, total, measure))
    if log_folder:
        parts.append(f"output in {log_folder}")
    if crash:
        parts.append(crash)
    return "; ".join(parts)


def _memory(largest: int, total: int | None, measure: str) -> str:
    figure = _size(largest)
    if total:
        figure += f" in the largest rank, {_size(total)} all ranks together"
    if measure == FOOTPRINT:
        return f"peak memory footprint {figure}, GPU included"
    if measure == RESIDENT_ON_MAC:
        return (
            f"peak resident memory {figure} (the GPU's memory not included: macOS's "
            "footprint could not be read)"
        )
    return f"peak memory {figure}"


class Clock:
    """The run's time: from the start until stop() (the script's end), not until the end line
    is printed, after the clean-up."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.stopped: float | None = None

    def stop(self) -> None:
        if self.stopped is None:
            self.stopped = time.monotonic()

    def elapsed(self) -> float:
        return (self.stopped or time.monotonic()) - self.started


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {seconds:02d} s"


def _size(count: int) -> str:
    return f"{count / 2**30:.2f} GB" if count >= 2**30 else f"{count / 2**20:.0f} MB"
