"""Faults in 2-process CPU runs (the torch.distributed.run path): signals, leftovers, listeners.

Complements tests/run/torchrun/test_torchrun.py, which already covers SIGTERM to the launcher with no handler
in the ranks (143), SIGUSR1 reaching both ranks, a grace-period kill of ranks that ignore
SIGTERM, a second signal, a failing or killed rank, and the loopback listeners of a default run.
Here: every forwarded signal with a handler in both ranks (each records it), helpers that ranks
started, the launcher's own process afterwards (in-process: no zombie, handlers restored), and
where the rendezvous listens with a fixed port, with c10d, and across two "machines".

What the torchrun path does with each signal (run/torchrun/signals.py):
- SIGINT, SIGTERM, SIGHUP, SIGQUIT stop the run: torch's agent sends the same signal to every
  rank, the launcher exits 128+N whatever the ranks' own codes (it was stopped by N).
- SIGUSR1, SIGUSR2 are only forwarded to every rank; the run goes on. If the ranks then exit
  with a code, that code is the result (the first failing rank's), like any other rank failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from helpers import write_script
from helpers import file_line
from test_faults import MARKER, in_process, run_env, survivors

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and uses Linux signals"),
              pytest.mark.slow]

TWO_CPU_RANKS = ["launch", "--cpu", "-q", "--num_processes", "2"]

# Each rank starts a helper, records the signal it gets in <folder>/got.<RANK>, then exits 7.
RANK_WAITS = """
import os, signal, subprocess, sys, time
from pathlib import Path
folder, rank = Path(sys.argv[1]), os.environ["RANK"]
helper = subprocess.Popen(["sleep", "120"])
def record(signum, frame):
    (folder / f"got.{rank}").write_text(signal.Signals(signum).name + "\\n")
    sys.exit(7)
for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
    signal.signal(getattr(signal, name), record)
(folder / f"ready.{rank}").write_text(f"{os.getpid()} {helper.pid}\\n")
time.sleep(120)
"""

STOPPING = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT]


@pytest.fixture
def marker():
    value = uuid.uuid4().hex
    yield value
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(MARKER) == value:
                process.kill()
        except psutil.Error:
            pass


def ready_files(folder: Path) -> list[Path]:
    return [folder / f"ready.{rank}" for rank in (0, 1)]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1],
                         ids=lambda s: signal.Signals(s).name)
def test_signal_to_the_launcher_reaches_both_ranks_and_nothing_survives(tmp_path, marker, signum):
    script = write_script(tmp_path, "wait.py", RANK_WAITS)
    launcher = subprocess.Popen([sys.executable, "-m", "mpslaunch", *TWO_CPU_RANKS, str(script), str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=run_env(marker))
    for path in ready_files(tmp_path):
        file_line(path, seconds=60)
    launcher.send_signal(signum)
    _, stderr = launcher.communicate(timeout=60)
    name = signal.Signals(signum).name
    assert [file_line(tmp_path / f"got.{rank}").strip() for rank in (0, 1)] == [name, name]
    if signum in STOPPING:
        assert launcher.returncode == 128 + signum, stderr
        assert f"stopped by {name}" in stderr
    else:  # forwarded only: the ranks chose to exit 7, and that is the run's result
        assert launcher.returncode == 7, stderr
        assert "exited with code 7" in stderr
    assert "Traceback" not in stderr
    assert survivors(marker, settle=2) == []  # both ranks and both helpers


def test_after_a_stopped_2_process_run_the_launcher_process_is_as_it_was(tmp_path, marker):
    """In-process (the launcher's process stays up to be inspected): no child and no zombie left,
    and the signal handlers it found are back (torch's agent installs its own during the run)."""
    script = write_script(tmp_path, "wait.py", RANK_WAITS)
    report = in_process(tmp_path, [*TWO_CPU_RANKS, str(script), str(tmp_path)], marker=marker,
                        send=signal.SIGINT, ready=ready_files(tmp_path))
    assert report["codes"] == [128 + signal.SIGINT]
    assert report["children_after"] == []
    assert report["after"]["handlers"] == report["before"]["handlers"]
    assert survivors(marker, settle=2) == []


def test_nothing_a_rank_started_outlives_a_successful_run(tmp_path, marker):
    """As on the single-process path (test_launch.py: nothing the child started outlives the run)."""
    script = write_script(tmp_path, "spawner.py", "import subprocess; subprocess.Popen(['sleep', '120'])\n")
    result = subprocess.run([sys.executable, "-m", "mpslaunch", *TWO_CPU_RANKS, str(script)],
                            capture_output=True, text=True, timeout=90, env=run_env(marker))
    assert result.returncode == 0, result.stderr
    assert survivors(marker, settle=2) == []


def listeners(marker: str) -> set[tuple[str, int]]:
    found = set()
    for process in psutil.process_iter():
        try:
            if process.pid == os.getpid() or process.environ().get(MARKER) != marker:
                continue
            found |= {(c.laddr.ip, c.laddr.port) for c in process.net_connections("inet")
                      if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue
    return found


LISTENERS_WHEN_READY = """
import os, sys, time, torch.distributed as dist
from pathlib import Path
folder = Path(sys.argv[1])
dist.init_process_group("gloo")
dist.barrier()
(folder / f"ready.{os.environ['RANK']}").write_text("up\\n")
while not (folder / "done").exists():
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
"""


def run_and_list_listeners(tmp_path: Path, marker: str, launches: list[list[str]]) -> set[tuple[str, int]]:
    """Start the launchers, list what every process of the run listens on once all ranks are up."""
    script = write_script(tmp_path, "listen.py", LISTENERS_WHEN_READY)
    launchers = [subprocess.Popen([sys.executable, "-m", "mpslaunch", *args, str(script), str(tmp_path)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=run_env(marker)) for args in launches]
    try:
        for path in ready_files(tmp_path):
            file_line(path, seconds=90)
        found = listeners(marker)
    finally:
        (tmp_path / "done").write_text("")
    for launcher in launchers:
        _, stderr = launcher.communicate(timeout=60)
        assert launcher.returncode == 0, stderr
    return found


def test_one_machine_with_a_fixed_port_and_c10d_listens_on_the_loopback_only(tmp_path, marker):
    """From outside the run (all its processes, found by marker), with the options most likely
    to make torch open its own store: a fixed port, and the c10d backend."""
    port = free_port()
    found = run_and_list_listeners(tmp_path, marker, [[*TWO_CPU_RANKS, "--main_process_port", str(port),
                                                       "--rdzv_backend", "c10d"]])
    assert found and {ip for ip, _ in found} == {"127.0.0.1"}, found
    assert ("127.0.0.1", port) in found


def test_two_machines_listen_only_on_the_address_the_user_gave(tmp_path, marker):
    """Two "machines" on this host (machine_rank 0 and 1, main_process_ip 127.0.0.1)."""
    port = free_port()
    common = ["launch", "--cpu", "-q", "--num_machines", "2", "--main_process_ip", "127.0.0.1",
              "--main_process_port", str(port)]
    found = run_and_list_listeners(tmp_path, marker, [[*common, "--machine_rank", str(rank)] for rank in (0, 1)])
    assert found and {ip for ip, _ in found} == {"127.0.0.1"}, found


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# Rank 1 exits with argv[1]; both end their process group first (no abort at exit).
ENDS_WITH = """
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
sys.exit(int(sys.argv[1]) if os.environ["RANK"] == "1" else 0)
"""


@pytest.mark.parametrize("code", [0, 3])
def test_with_warnings_as_errors_the_launcher_leaves_no_rank_log_open(tmp_path, marker, code):
    """PYTHONWARNINGS=error: the files torch opened for the ranks' output are closed, whether
    the ranks ended by themselves or were stopped; not one warning from the launcher."""
    script = write_script(tmp_path, "ends.py", ENDS_WITH)
    env = {**run_env(marker), "PYTHONWARNINGS": "error"}
    done = subprocess.run([sys.executable, "-m", "mpslaunch", *TWO_CPU_RANKS, "--log_dir",
                           str(tmp_path / "logs"), str(script), str(code)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == code, done.stderr[-2000:]
    assert "Warning" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-2000:]
