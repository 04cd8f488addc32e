"""A described Mac keeps itself awake for as long as the run lasts, and never longer.

The launcher runs with a Mac's platform facts (test_described_mac.py's harness) and finds a
`caffeinate` on PATH that records how it was called, while it lives, and how it ended: by the
launcher's SIGTERM, or by itself once the launcher's pid was gone (caffeinate's own -w). The
script checks that it is held while it runs. On Linux nothing calls it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from helpers import run_cli, write_script
from test_described_mac import BUILD, ON_A_MAC

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="describes a Mac on Linux"),
              pytest.mark.slow]

FAKE_CAFFEINATE = """#!{python}
import json, os, signal, sys, time
log = os.environ["FAKE_CAFFEINATE_LOG"]
def record(entry):
    with open(log, "a") as stream:
        stream.write(json.dumps(entry) + "\\n")
def stopped(signum, frame):
    record({{"ended": signal.Signals(signum).name}})
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
record({{"argv": sys.argv[1:], "pid": os.getpid(), "parent": os.getppid()}})
watched = int(sys.argv[sys.argv.index("-w") + 1])
while True:  # what -w does: end once that process is gone
    try:
        os.kill(watched, 0)
    except ProcessLookupError:
        record({{"ended": "the watched process is gone"}})
        sys.exit(0)
    time.sleep(0.05)
"""

# Says whether a caffeinate holds the Mac while it runs (caffeinate starts beside the script, so
# it may take a moment to say so), then ends as asked.
SCRIPT = """
import json, os, sys, time, psutil
from pathlib import Path
log = Path(os.environ["FAKE_CAFFEINATE_LOG"])
deadline = time.monotonic() + (30 if "--expect-held" in sys.argv else 1)
while not (log.exists() and log.read_text().endswith("\\n")) and time.monotonic() < deadline:
    time.sleep(0.02)
started = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
held = bool(started) and psutil.pid_exists(started[0]["pid"]) and "ended" not in started[-1]
Path(sys.argv[1]).write_text(json.dumps({"held": held, "pid": os.getpid()}) + "\\n")
how = sys.argv[2]
if how == "fail":
    sys.exit(3)
if how == "wait":
    time.sleep(60)
"""


@pytest.fixture
def caffeinate(tmp_path):
    """A fake caffeinate first on PATH; returns (environment, the log it writes)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    fake = folder / "caffeinate"
    fake.write_text(FAKE_CAFFEINATE.format(python=sys.executable))
    fake.chmod(0o755)
    log = tmp_path / "caffeinate.log"
    env = {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}",
           "FAKE_CAFFEINATE_LOG": str(log)}
    return env, log


def launch_on_a_mac(env: dict, *args: str) -> subprocess.Popen:
    sysctls = {"kern.osproductversion": "15.5", "kern.osversion": BUILD,
               "machdep.cpu.brand_string": "Apple M4", "kern.hv_vmm_present": "0"}
    return subprocess.Popen([sys.executable, "-c", ON_A_MAC, json.dumps(sysctls), "launch", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def entries(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def wait_for(path: Path, timeout: float = 60) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return json.loads(path.read_text())


def assert_held_then_released(log: Path, launcher: subprocess.Popen, report: dict, how_ended: str):
    first, *rest = entries(log)
    assert first["argv"] == ["-i", "-w", str(launcher.pid)]  # idle sleep only, tied to the launcher
    assert first["parent"] == launcher.pid
    assert report["held"], "no caffeinate held the Mac while the script ran"
    assert rest == [{"ended": how_ended}], rest  # ended once, and before the launcher returned
    assert not psutil.pid_exists(first["pid"]) or \
        psutil.Process(first["pid"]).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("how, code", [("end", 0), ("fail", 3)])
def test_held_while_the_script_runs_and_released_when_it_ends(tmp_path, caffeinate, how, code):
    env, log = caffeinate
    script = write_script(tmp_path, "train.py", SCRIPT)
    launcher = launch_on_a_mac(env, "--cpu", str(script), str(tmp_path / "report"), how, "--expect-held")
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == code, stderr
    assert "; kept awake while it runs" in stderr.splitlines()[0]
    assert_held_then_released(log, launcher, wait_for(tmp_path / "report"), "SIGTERM")


def start_a_waiting_script(tmp_path: Path, env: dict) -> tuple[subprocess.Popen, dict]:
    """The launcher on a described Mac, and the report of its script, which waits to be stopped."""
    script = write_script(tmp_path, "train.py", SCRIPT)
    launcher = launch_on_a_mac(env, "--cpu", str(script), str(tmp_path / "report"), "wait", "--expect-held")
    return launcher, wait_for(tmp_path / "report")


@pytest.mark.parametrize("stop, code", [
    (lambda launcher, report: launcher.send_signal(signal.SIGTERM), 128 + signal.SIGTERM),
    (lambda launcher, report: os.kill(report["pid"], signal.SIGKILL), 128 + signal.SIGKILL),
], ids=["the launcher stopped with SIGTERM", "the script killed with SIGKILL"])
def test_released_when_the_run_is_stopped(tmp_path, caffeinate, stop, code):
    env, log = caffeinate
    launcher, report = start_a_waiting_script(tmp_path, env)
    stop(launcher, report)
    launcher.communicate(timeout=120)
    assert launcher.returncode == code
    assert_held_then_released(log, launcher, report, "SIGTERM")


def test_a_launcher_killed_with_sigkill_leaves_no_caffeinate(tmp_path, caffeinate):
    """Nothing of the launcher's runs after a SIGKILL: -w <launcher pid> ends caffeinate."""
    env, log = caffeinate
    launcher, report = start_a_waiting_script(tmp_path, env)
    launcher.kill()
    launcher.communicate(timeout=60)
    pid = entries(log)[0]["pid"]
    try:
        psutil.Process(pid).wait(30)
    except psutil.NoSuchProcess:
        pass
    assert report["held"] and entries(log)[1:] == [{"ended": "the watched process is gone"}]


def test_the_key_and_the_flag_let_the_mac_sleep(tmp_path, caffeinate):
    env, log = caffeinate
    script = write_script(tmp_path, "train.py", SCRIPT)
    profile = tmp_path / "p.yaml"
    profile.write_text("version: 1\nkeep_awake: false\n")
    for args in (["--no_keep_awake"], ["--no-keep-awake"], ["--config_file", str(profile)]):
        launcher = launch_on_a_mac(env, "--cpu", *args, str(script), str(tmp_path / "report"), "end")
        _, stderr = launcher.communicate(timeout=120)
        assert launcher.returncode == 0, stderr
        assert "kept awake" not in stderr and not log.exists()
        assert wait_for(tmp_path / "report")["held"] is False


def test_on_linux_caffeinate_is_never_called(tmp_path, caffeinate):
    env, log = caffeinate
    script = write_script(tmp_path, "train.py", SCRIPT)
    result = run_cli("launch", "--cpu", str(script), str(tmp_path / "report"), "end", env=env)
    assert result.returncode == 0, result.stderr
    assert not log.exists() and "awake" not in result.stderr


def test_without_caffeinate_on_path_nothing_claims_the_mac_is_kept_awake(tmp_path):
    assert not shutil.which("caffeinate")  # this machine's PATH, as on a Mac that lost /usr/bin
    script = write_script(tmp_path, "train.py", SCRIPT)
    env = {**os.environ, "FAKE_CAFFEINATE_LOG": str(tmp_path / "caffeinate.log")}
    launcher = launch_on_a_mac(env, "--cpu", str(script), str(tmp_path / "report"), "end")
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, stderr
    warning, plan, end = stderr.strip().splitlines()
    assert warning == ("mpslaunch: warning: caffeinate is not on PATH (it is /usr/bin/caffeinate), "
                       "so nothing keeps this Mac awake: it may sleep and pause the run; "
                       "keep_awake: false in the profile (or --no_keep_awake) silences this")
    assert plan.startswith("mpslaunch: cpu") and "awake" not in plan
    assert end.startswith("mpslaunch: ended after ")
    assert wait_for(tmp_path / "report")["held"] is False


PMSET_ON_BATTERY = """#!/bin/sh
printf "Now drawing from 'Battery Power'\\n -InternalBattery-0 (id=4653155)\\t84%%; discharging; 5:12 remaining present: true\\n"
"""


def test_on_battery_the_plan_says_closing_the_lid_pauses_the_run(tmp_path, caffeinate):
    env, log = caffeinate
    folder = Path(env["PATH"].split(os.pathsep)[0])
    (folder / "pmset").write_text(PMSET_ON_BATTERY)
    (folder / "pmset").chmod(0o755)
    script = write_script(tmp_path, "train.py", SCRIPT)
    launcher = launch_on_a_mac(env, "--cpu", str(script), str(tmp_path / "report"), "end")
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, stderr
    warning, plan, end = stderr.strip().splitlines()
    assert warning == ("mpslaunch: warning: this Mac runs on its battery: closing the lid sleeps "
                       "it and pauses the run; keep_awake: false in the profile (or "
                       "--no_keep_awake) silences this")
    assert plan.endswith("; kept awake while it runs")
    silenced = launch_on_a_mac(env, "--cpu", "--no_keep_awake", str(script), str(tmp_path / "r2"), "end")
    _, stderr = silenced.communicate(timeout=120)
    assert "warning" not in stderr and "awake" not in stderr
