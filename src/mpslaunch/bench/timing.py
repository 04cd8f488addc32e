"""Timing one operation correctly on a device that may run it asynchronously.

cuda and mps return from `B @ a` as soon as the work is queued, so timing the Python call
measures the queueing, not the work (the classic blog mistake). Here every timed sample is

    synchronize; start clock; run the op `inner` times; synchronize; stop clock

after warm-up calls (first calls pay for kernel selection, cuBLAS/MPS graph setup, allocator
growth). `inner` is calibrated so one sample lasts about `sample_seconds`, which makes the
synchronize and clock overhead (microseconds) negligible even for tiny ops. Several samples
give the median and the interquartile range.

Slow ops (one call longer than a sample) use inner = 1 and as many samples as fit in
`budget_seconds`, but never fewer than MIN_SAMPLES (or `repeats`, if smaller); warm-up stops
after one call once it has used the budget, so a big CPU matmul does not take minutes.

We time by hand instead of with torch.utils.benchmark.Timer: its timer synchronizes mps only
since it became accelerator-agnostic (pytorch/pytorch PR #157131, mid-2025, torch 2.9); before,
it synchronized cuda alone, and this project supports torch 2.4+.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

MIN_SAMPLES = 3
MAX_INNER = 1_000_000


@dataclass(frozen=True)
class Timing:
    """Seconds per single op: median and quartiles over `samples` samples of `inner` ops."""

    median_s: float
    p25_s: float
    p75_s: float
    samples: int
    inner: int

    @property
    def iqr_s(self) -> float:
        return self.p75_s - self.p25_s


def time_op(
    op: Callable[[], object],
    synchronize: Callable[[], None],
    *,
    repeats: int,
    warmup: int,
    sample_seconds: float = 0.025,
    budget_seconds: float = 5.0,
) -> Timing:
    """Median time of one call of `op`, with the device synchronized around every sample."""
    _warm_up(op, synchronize, warmup, budget_seconds)
    inner, first_sample = _calibrate(op, synchronize, sample_seconds)
    samples = _sample_count(repeats, first_sample, budget_seconds)
    # A slow op's calibration run is already one clean sample of inner = 1: keep it.
    kept = [first_sample] if inner == 1 else []
    timed = kept + [_timed_sample(op, synchronize, inner) for _ in range(samples - len(kept))]
    p25, median, p75 = _quartiles([seconds / inner for seconds in timed])
    return Timing(median_s=median, p25_s=p25, p75_s=p75, samples=samples, inner=inner)


def _warm_up(
    op: Callable[[], object], synchronize: Callable[[], None], calls: int, budget_seconds: float
) -> None:
    """Untimed calls; one is enough for an op so slow that the rest would blow the budget."""
    start = time.perf_counter()
    for _ in range(calls):
        op()
        synchronize()
        if time.perf_counter() - start > budget_seconds:
            break


def _timed_sample(op: Callable[[], object], synchronize: Callable[[], None], inner: int) -> float:
    synchronize()  # nothing queued before us may count against this sample
    start = time.perf_counter()
    for _ in range(inner):
        op()
    synchronize()  # the clock stops when the device has finished, not when Python has
    return time.perf_counter() - start


def _calibrate(
    op: Callable[[], object], synchronize: Callable[[], None], sample_seconds: float
) -> tuple[int, float]:
    """Grow `inner` until a sample is long enough to measure.

    Returns the inner count for the real samples and the expected seconds of one such sample.
    For inner = 1 that is exactly the last calibration sample, which the caller may keep.
    """
    inner = 1
    while True:
        elapsed = _timed_sample(op, synchronize, inner)
        if elapsed >= sample_seconds / 4 or inner >= MAX_INNER:
            break
        inner = min(MAX_INNER, inner * 10)
    per_op = max(elapsed / inner, 1e-9)
    chosen = max(1, min(MAX_INNER, math.ceil(sample_seconds / per_op)))
    return chosen, (elapsed if chosen == inner == 1 else per_op * chosen)


def _sample_count(repeats: int, seconds_per_sample: float, budget_seconds: float) -> int:
    affordable = int(budget_seconds // max(seconds_per_sample, 1e-9))
    return max(min(repeats, MIN_SAMPLES), min(repeats, affordable))


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    p25, median, p75 = statistics.quantiles(values, n=4, method="inclusive")
    return p25, median, p75
