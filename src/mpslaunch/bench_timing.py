"""Timing one operation correctly on a device that may run it asynchronously.

cuda and mps return from `B @ a` as soon as the work is queued, so timing the Python call
measures the queueing, not the work (the classic blog mistake). Here every timed sample is

    synchronize; start clock; run the op `inner` times; synchronize; stop clock

after warm-up calls (first calls pay for kernel selection, cuBLAS/MPS graph setup, allocator
growth). `inner` is calibrated so one sample lasts about `sample_seconds`, which makes the
synchronize and clock overhead (microseconds) negligible even for tiny ops. Several samples
give the median and the interquartile range.

Slow ops (one call longer than a sample) use inner = 1 and as many samples as fit in
`budget_seconds`, but never fewer than MIN_SAMPLES (or `repeats`, if smaller), so a big CPU matmul does not take minutes.

We time by hand instead of with torch.utils.benchmark.Timer: its synchronization covers mps
only in recent torch (it used to synchronize cuda alone), and this project supports torch 2.4+.
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
    for _ in range(warmup):
        op()
    synchronize()
    inner, seconds_per_op = _calibrate(op, synchronize, sample_seconds)
    samples = _sample_count(repeats, seconds_per_op * inner, budget_seconds)
    per_op = [_timed_sample(op, synchronize, inner) / inner for _ in range(samples)]
    p25, median, p75 = _quartiles(per_op)
    return Timing(median_s=median, p25_s=p25, p75_s=p75, samples=samples, inner=inner)


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
    """Grow `inner` until a sample is long enough to measure; return it and seconds per op."""
    inner = 1
    while True:
        elapsed = _timed_sample(op, synchronize, inner)
        per_op = max(elapsed / inner, 1e-9)
        if elapsed >= sample_seconds / 4 or inner >= MAX_INNER:
            return max(1, min(MAX_INNER, math.ceil(sample_seconds / per_op))), per_op
        inner = min(MAX_INNER, inner * 10)


def _sample_count(repeats: int, seconds_per_sample: float, budget_seconds: float) -> int:
    affordable = int(budget_seconds // max(seconds_per_sample, 1e-9))
    return max(min(repeats, MIN_SAMPLES), min(repeats, affordable))


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    p25, median, p75 = statistics.quantiles(values, n=4, method="inclusive")
    return p25, median, p75
