"""The shell's job control and the caller's own processes, on both run paths (one process and two).

- nohup and `&`: a signal the launcher was started with ignored (SIGHUP under nohup, SIGINT for a
  non-interactive shell's background job) stays ignored, as it does for `python script.py`.
- Ctrl-Z: the script (in a session of its own) stops with the launcher, and continues with it.
- mpslaunch.launch() from a program that has processes of its own: only the run's are touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from helpers import file_line, wait_for, write_script
from test_faults import kill_run, run_env, survivors

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and uses Linux signals"),
              pytest.mark.slow]

# Each process (RANK 0 alone on the one-process path) says it is ready, waits for <folder>/go,
# then says it finished.
WAITS_FOR_GO = """
import os, sys, time
from pathlib import Path
folder, rank = Path(sys.argv[1]), os.environ.get("RANK", "0")
(folder / f"ready.{rank}").write_text(f"{os.getpid()}\\n")
while not (folder / "go").exists():
    time.sleep(0.05)
(folder / f"finished.{rank}").write_text("yes\\n")
"""

PROCESSES = {"one process": 1, "two processes": 2}


@pytest.fixture
def marker():
    value = uuid.uuid4().hex
    yield value
    kill_run(value)


def launch_args(processes: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mpslaunch", "launch", "--cpu", "-q",
            *(["--num_processes", str(processes)] if processes > 1 else []), *extra]


def ready_pids(folder: Path, processes: int) -> list[int]:
    return [int(file_line(folder / f"ready.{rank}", seconds=90)) for rank in range(processes)]


def ignoring(signum: int):
    """What nohup (SIGHUP) and a non-interactive shell's `&` (SIGINT) do before they exec."""
    return lambda: signal.signal(signum, signal.SIG_IGN)


@pytest.mark.parametrize("processes", PROCESSES.values(), ids=PROCESSES.keys())
@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT], ids=["nohup-HUP", "background-INT"])
def test_a_signal_ignored_when_the_launcher_starts_stays_ignored(tmp_path, marker, signum, processes):
    """`nohup mpslaunch launch sleeper.py & kill -HUP $!`: the script keeps running and ends well."""
    script = write_script(tmp_path, "sleeper.py", WAITS_FOR_GO)
    launcher = subprocess.Popen([*launch_args(processes), str(script), str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=run_env(marker), preexec_fn=ignoring(signum))
    ready_pids(tmp_path, processes)
    launcher.send_signal(signum)
    time.sleep(1.0)  # a handler would have forwarded it by now (it runs within milliseconds)
    (tmp_path / "go").write_text("")
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, stderr
    assert all((tmp_path / f"finished.{rank}").exists() for rank in range(processes)), stderr


def status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"


def statuses_once(pids: list[int], done) -> list[str]:
    """The processes' states once `done(states)` holds, or after 30 s."""
    wait_for(lambda: done([status(pid) for pid in pids]))
    return [status(pid) for pid in pids]


@pytest.mark.parametrize("processes", PROCESSES.values(), ids=PROCESSES.keys())
def test_ctrl_z_stops_the_script_and_the_launcher_and_fg_continues_both(tmp_path, marker, processes):
    script = write_script(tmp_path, "sleeper.py", WAITS_FOR_GO)
    launcher = subprocess.Popen([*launch_args(processes), str(script), str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=run_env(marker))
    scripts = ready_pids(tmp_path, processes)
    try:
        launcher.send_signal(signal.SIGTSTP)  # what the terminal sends the foreground job
        everyone = [*scripts, launcher.pid]
        stopped = statuses_once(everyone, lambda found: set(found) == {psutil.STATUS_STOPPED})
        assert stopped == [psutil.STATUS_STOPPED] * len(everyone)
        launcher.send_signal(signal.SIGCONT)  # the shell's fg or bg
        going = statuses_once(everyone, lambda found: psutil.STATUS_STOPPED not in found)
        assert psutil.STATUS_STOPPED not in going, going
    finally:
        (tmp_path / "go").write_text("")
        launcher.send_signal(signal.SIGCONT)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, stderr
    assert all((tmp_path / f"finished.{rank}").exists() for rank in range(processes))
    assert survivors(marker, settle=2) == []


CALLER = """
import subprocess, sys
import mpslaunch
helper = subprocess.Popen(["sleep", "120"], start_new_session=True)
code = mpslaunch.launch(sys.argv[1], cpu=True, num_processes=int(sys.argv[2]), quiet=True)
alive = helper.poll() is None
helper.kill()
helper.wait()
print(f"code={code} helper_alive={alive}")
"""


@pytest.mark.parametrize("processes", PROCESSES.values(), ids=PROCESSES.keys())
def test_the_python_api_leaves_the_callers_own_processes_alone(tmp_path, marker, processes):
    """A program with a helper in a session of its own calls mpslaunch.launch(): the run's
    clean-up takes only what carries the run's marker, never the caller's helper."""
    ok = write_script(tmp_path, "ok.py", "print('ok')\n")
    caller = write_script(tmp_path, "caller.py", CALLER)
    result = subprocess.run([sys.executable, str(caller), str(ok), str(processes)],
                            capture_output=True, text=True, timeout=120, env=run_env(marker))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "code=0 helper_alive=True", result.stderr
