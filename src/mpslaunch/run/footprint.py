"""macOS: the peak memory footprint of another process, as the kernel counts it.

On Apple silicon the GPU's memory is the process's own: Metal buffers in unified memory are
charged to its *physical footprint* (what Activity Monitor's Memory column shows), not to its
resident size. `proc_pid_rusage(pid, RUSAGE_INFO_V4, &info)` in libproc returns
`ri_lifetime_max_phys_footprint`, the largest footprint the process has had: what
`/usr/bin/time -l` prints as "peak memory footprint". psutil does not expose it, so it is read
through ctypes (docs/mps-facts.md: Memory on a Mac).
"""

from __future__ import annotations

import ctypes
import os

LIBPROC = "/usr/lib/libproc.dylib"
RUSAGE_INFO_V4 = 4

# struct rusage_info_v4 in <sys/resource.h>: a 16-byte uuid, then 35 unsigned 64-bit counters
# in this order. Only the order matters here; every field is named so the offsets are Apple's.
_V4_COUNTERS = (
    "ri_user_time",
    "ri_system_time",
    "ri_pkg_idle_wkups",
    "ri_interrupt_wkups",
    "ri_pageins",
    "ri_wired_size",
    "ri_resident_size",
    "ri_phys_footprint",
    "ri_proc_start_abstime",
    "ri_proc_exit_abstime",
    "ri_child_user_time",
    "ri_child_system_time",
    "ri_child_pkg_idle_wkups",
    "ri_child_interrupt_wkups",
    "ri_child_pageins",
    "ri_child_elapsed_abstime",
    "ri_diskio_bytesread",
    "ri_diskio_byteswritten",
    "ri_cpu_time_qos_default",
    "ri_cpu_time_qos_maintenance",
    "ri_cpu_time_qos_background",
    "ri_cpu_time_qos_utility",
    "ri_cpu_time_qos_legacy",
    "ri_cpu_time_qos_user_initiated",
    "ri_cpu_time_qos_user_interactive",
    "ri_billed_system_time",
    "ri_serviced_system_time",
    "ri_logical_writes",
    "ri_lifetime_max_phys_footprint",
    "ri_instructions",
    "ri_cycles",
    "ri_billed_energy",
    "ri_serviced_energy",
    "ri_interval_max_phys_footprint",
    "ri_runnable_time",
)


class RusageInfoV4(ctypes.Structure):
    _fields_ = [
        ("ri_uuid", ctypes.c_uint8 * 16),
        *((name, ctypes.c_uint64) for name in _V4_COUNTERS),
    ]


class FootprintReader:
    """Reads peak footprints through `library` (libproc); `available` is False where it cannot
    be loaded (not macOS, a sandbox), and then every read is None."""

    def __init__(self, library: str = LIBPROC):
        self.call = _load(library)

    @property
    def available(self) -> bool:
        return self.call is not None

    def peak(self, pid: int) -> int | None:
        """The largest physical footprint `pid` has had, in bytes; None once it is gone, or
        when the kernel refuses (another user's process)."""
        if self.call is None:
            return None
        info = RusageInfoV4()
        if self.call(pid, RUSAGE_INFO_V4, ctypes.byref(info)) != 0:
            return None
        return info.ri_lifetime_max_phys_footprint or None


def _load(library: str):
    if not library:
        return None
    try:
        call = ctypes.CDLL(library, use_errno=True).proc_pid_rusage
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
    call.restype = ctypes.c_int
    return call


_reader: FootprintReader | None = None


def reader() -> FootprintReader:
    """The process's one reader of the system's libproc, loaded at first use (macOS only)."""
    global _reader
    if _reader is None:
        _reader = FootprintReader(LIBPROC if os.uname().sysname == "Darwin" else "")
    return _reader
