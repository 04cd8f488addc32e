"""The macOS peak memory footprint, read through a stand-in libproc: a real shared library built
here with the C compiler, exporting `proc_pid_rusage` as macOS declares it, that fills every
counter of `struct rusage_info_v4` with a different value. The reader must return the one in
`ri_lifetime_max_phys_footprint`, through the same ctypes call it makes on a Mac."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import sys

import pytest

from mpslaunch.run.footprint import RUSAGE_INFO_V4, FootprintReader, RusageInfoV4

pytestmark = pytest.mark.skipif(sys.platform != "linux" or not shutil.which("cc"),
                                reason="builds a stand-in libproc with the C compiler (Linux)")

# The counters' places in <sys/resource.h>'s struct rusage_info_v4 (a 16-byte uuid, then 35
# uint64 counters): resident size 6, phys footprint 7, logical writes 27, lifetime max phys
# footprint 28, instructions 29. Counter i holds (i + 1) MiB; the lifetime maximum holds the
# value of STANDIN_FOOTPRINT (bytes), read at each call. Unknown pids: -1 and ESRCH.
STANDIN_LIBPROC = r"""
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int proc_pid_rusage(int pid, int flavor, void *buffer) {
    if (flavor != 4) { errno = EINVAL; return -1; }
    if (kill(pid, 0) != 0 && errno == ESRCH) return -1;
    memset(buffer, 0xab, 16);
    uint64_t *counters = (uint64_t *)((char *)buffer + 16);
    for (int i = 0; i < 35; i++) counters[i] = (uint64_t)(i + 1) << 20;
    const char *footprint = getenv("STANDIN_FOOTPRINT");
    counters[28] = footprint ? strtoull(footprint, NULL, 10) : 0;
    return 0;
}
"""

FOOTPRINT = 8_482_560_409  # 7.90 GB


def build_standin_libproc(folder) -> str:
    """The stand-in compiled into `folder`; its path (tests elsewhere use it too)."""
    source, library = folder / "libproc.c", folder / "libproc.so"
    source.write_text(STANDIN_LIBPROC)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return str(library)


@pytest.fixture
def libproc(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("STANDIN_FOOTPRINT", str(FOOTPRINT))
    return build_standin_libproc(tmp_path)


def test_the_struct_is_apples_layout():
    assert ctypes.sizeof(RusageInfoV4) == 16 + 35 * 8
    assert RusageInfoV4.ri_resident_size.offset == 16 + 6 * 8
    assert RusageInfoV4.ri_phys_footprint.offset == 16 + 7 * 8
    assert RusageInfoV4.ri_lifetime_max_phys_footprint.offset == 16 + 28 * 8
    assert RUSAGE_INFO_V4 == 4


def test_the_figure_is_the_lifetime_maximum_footprint(libproc):
    reader = FootprintReader(libproc)
    assert reader.available
    assert reader.peak(os.getpid()) == FOOTPRINT
    # Not the neighbours: the resident size, the current footprint, the next counters.
    assert FOOTPRINT not in {(i + 1) << 20 for i in range(35)}


def test_a_process_that_is_gone_has_no_figure(libproc):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert FootprintReader(libproc).peak(child.pid) is None


def test_a_zero_footprint_is_no_figure(libproc, monkeypatch):
    monkeypatch.setenv("STANDIN_FOOTPRINT", "0")
    assert FootprintReader(libproc).peak(os.getpid()) is None


def test_no_libproc_means_no_reader(tmp_path):
    for missing in ("", str(tmp_path / "absent.dylib")):
        reader = FootprintReader(missing)
        assert not reader.available and reader.peak(1) is None
    # A library without proc_pid_rusage (Linux's C library) is not one either.
    assert not FootprintReader(ctypes.util.find_library("c") or "libc.so.6").available
