"""One benchmark point, made safe: memory check, allocation, timing, clean-up.

A size that cannot fit is "does not fit" (from the free memory first, so a huge cpu size or
batch never wakes the OOM killer; then from the backend's out-of-memory error); any other error
of the op is "failed" with its first line. Device memory is freed after every point.
"""

from __future__ import annotations

from mpslaunch.bench import devices, workloads
from mpslaunch.bench.report import DOES_NOT_FIT, FAILED, OK, Result
from mpslaunch.bench.timing import time_op
from mpslaunch.output import error_line

TYPE_CHECKING = False  # as typing.TYPE_CHECKING
if TYPE_CHECKING:
    from typing import Any

# Leave headroom: the allocator, the framework and the rest of the system need some too.
USABLE_FRACTION = 0.9
GIB = 1024**3


def measure(workload: str, dtype: str, size: int, device: str, options) -> Result:
    try:
        return _measure(workload, dtype, size, device, options)
    finally:
        # Runs after the exception (and the frames holding the tensors) is gone.
        devices.free_memory(device)


def _measure(workload: str, dtype: str, size: int, device: str, options) -> Result:
    point: dict[str, Any] = dict(
        workload=workload,
        dtype=dtype,
        device=device,
        size=size,
        flops=workloads.flops(workload, size),
    )
    too_big = _does_not_fit_reason(workload, dtype, size, device)
    if too_big:
        return Result(status=DOES_NOT_FIT, note=too_big, **point)
    try:
        op = workloads.prepare(workload, device, dtype, size)
        timing = time_op(
            op,
            lambda: devices.synchronize(device),
            repeats=options.repeats,
            warmup=options.warmup,
            budget_seconds=options.budget,
        )
    except (RuntimeError, TypeError, NotImplementedError, MemoryError) as error:
        if devices.is_out_of_memory(error):
            return Result(status=DOES_NOT_FIT, note="out of memory", **point)
        return Result(status=FAILED, note=error_line(error)[:200], **point)
    return Result(status=OK, timing=timing, **point)


def _does_not_fit_reason(workload: str, dtype: str, size: int, device: str) -> str:
    needed = workloads.bytes_needed(workload, dtype, size)
    available = devices.free_bytes(device)
    if available is None or needed <= available * USABLE_FRACTION:
        return ""
    return f"needs {needed / GIB:.1f} GiB, {available / GIB:.1f} GiB free"
