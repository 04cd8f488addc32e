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

from helpers import FOOTPRINT, build_standin_libproc
from mpslaunch.run.footprint import RUSAGE_INFO_V4, FootprintReader, RusageInfoV4

pytestmark = pytest.mark.skipif(sys.platform != "linux" or not shutil.which("cc"),
                                reason="builds a stand-in libproc with the C compiler (Linux)")


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


@pytest.mark.slow
def test_the_figure_is_the_lifetime_maximum_footprint(libproc):
    reader = FootprintReader(libproc)
    assert reader.available
    assert reader.peak(os.getpid()) == FOOTPRINT
    # Not the neighbours: the resident size, the current footprint, the next counters.
    assert FOOTPRINT not in {(i + 1) << 20 for i in range(35)}


@pytest.mark.slow
def test_a_process_that_is_gone_has_no_figure(libproc):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert FootprintReader(libproc).peak(child.pid) is None


@pytest.mark.slow
def test_a_zero_footprint_is_no_figure(libproc, monkeypatch):
    monkeypatch.setenv("STANDIN_FOOTPRINT", "0")
    assert FootprintReader(libproc).peak(os.getpid()) is None


@pytest.mark.slow
def test_no_libproc_means_no_reader(tmp_path):
    for missing in ("", str(tmp_path / "absent.dylib")):
        reader = FootprintReader(missing)
        assert not reader.available and reader.peak(1) is None
    # A library without proc_pid_rusage (Linux's C library) is not one either.
    assert not FootprintReader(ctypes.util.find_library("c") or "libc.so.6").available
