"""The figures at the end of a run on a described Mac (test_described_mac.py's harness: the
launcher is told it runs macOS; the script, the launcher and its threads are real)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import psutil
import pytest

from helpers import wait_for, write_script
from test_described_mac import BUILD, ON_A_MAC

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="describes a Mac on Linux"),
              pytest.mark.slow]

END = re.compile(r"^mpslaunch: ended after (\d+\.\d) s, exit code 0(.*)$")

# A sysctl that never answers the memory-pressure question (it records its pid first).
HANGING_SYSCTL = """#!/bin/sh
case "$*" in *memorystatus_vm_pressure_level*) echo $$ >> "$SYSCTL_LOG"; exec sleep 60;; esac
exit 1
"""


def launch_on_a_mac(env: dict, *args: str) -> subprocess.CompletedProcess:
    sysctls = {"kern.osproductversion": "15.5", "kern.osversion": BUILD,
               "machdep.cpu.brand_string": "Apple M4 Max", "kern.hv_vmm_present": "0"}
    return subprocess.run([sys.executable, "-c", ON_A_MAC, json.dumps(sysctls), "launch", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_a_hanging_sysctl_delays_neither_the_end_nor_the_peak(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "sysctl").write_text(HANGING_SYSCTL)
    (folder / "sysctl").chmod(0o755)
    log = tmp_path / "sysctl.log"
    env = {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "SYSCTL_LOG": str(log)}
    script = write_script(tmp_path, "short.py", "import time\ntime.sleep(2.5)\n")
    done = launch_on_a_mac(env, "--cpu", "--no_keep_awake", str(script))
    try:
        assert done.returncode == 0, done.stderr
        # The launcher has ended while the sysctl it asked still hangs: it did not wait for it.
        asked = [int(pid) for pid in log.read_text().split()]
        assert asked and psutil.pid_exists(asked[0])
        ended = END.match(done.stderr.strip().splitlines()[-1])
        assert ended, done.stderr
        assert float(ended.group(1)) < 5.0  # the script's time, not the sysctl's 5 s time-out
        assert "peak resident memory" in ended.group(2)  # sampled while the script ran
    finally:
        for pid in [int(pid) for pid in log.read_text().split()] if log.exists() else []:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        wait_for(lambda: not any(psutil.pid_exists(int(p)) for p in log.read_text().split()), 10)


# The harness, with the footprint read through the library STANDIN_LIBPROC names (a stand-in
# built from C; the same ctypes call as on a Mac), or through none at all.
WITH_LIBPROC = """
import os
from mpslaunch.run import footprint
footprint.LIBPROC = os.environ.get("STANDIN_LIBPROC", "/nonexistent/libproc.dylib")
""" + ON_A_MAC


def run_on_a_mac_with(env: dict, *args: str) -> subprocess.CompletedProcess:
    sysctls = {"kern.osproductversion": "15.5", "kern.osversion": BUILD,
               "machdep.cpu.brand_string": "Apple M4 Max", "kern.hv_vmm_present": "0"}
    return subprocess.run([sys.executable, "-c", WITH_LIBPROC, json.dumps(sysctls), "launch",
                           "--cpu", "--no_keep_awake", *args],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.skipif(not shutil.which("cc"), reason="builds the stand-in libproc with cc")
def test_the_end_line_reports_the_peak_footprint_libproc_gives(tmp_path):
    from helpers import FOOTPRINT, build_standin_libproc

    env = {**os.environ, "STANDIN_LIBPROC": build_standin_libproc(tmp_path),
           "STANDIN_FOOTPRINT": str(FOOTPRINT)}
    script = write_script(tmp_path, "train.py", "import time\ntime.sleep(1.5)\n")
    done = run_on_a_mac_with(env, str(script))
    assert done.returncode == 0, done.stderr
    ended = END.match(done.stderr.strip().splitlines()[-1])
    assert ended and ended.group(2) == "; peak memory footprint 7.90 GB, GPU included", done.stderr


def test_without_libproc_the_end_line_says_it_reports_the_resident_size(tmp_path):
    script = write_script(tmp_path, "train.py", "import time\ntime.sleep(1.5)\n")
    done = run_on_a_mac_with(dict(os.environ), str(script))
    assert done.returncode == 0, done.stderr
    ended = END.match(done.stderr.strip().splitlines()[-1])
    assert ended and re.fullmatch(r"; peak resident memory \d+ MB \(the GPU's memory not included: "
                                  r"macOS's footprint could not be read\)", ended.group(2)), done.stderr
