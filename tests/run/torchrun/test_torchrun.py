"""The torchrun path end to end: real 2-process gloo runs on the CPU, through the CLI.

Each test starts `python -m mpslaunch launch --cpu --num_processes 2 ...` in a subprocess, as
a user would, with a script written to tmp_path. Several processes on this path go through
torch.distributed.run inside the launcher; these tests check what the user sees: results, rank
prefixes, exit codes, summaries, and that no process of the run is left afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import own_lines, run_cli, two_gloo_ranks_ended_well, wait_for, write_script

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and /proc"),
              pytest.mark.slow]

TWO_CPU_RANKS = ("launch", "--cpu", "--num_processes", "2")

# Writes its pid to <folder>/pid.<RANK> so a test can find (and later check) every rank.
RANK_PREAMBLE = """
import os, sys, signal, time, json
from pathlib import Path
RANK = int(os.environ["RANK"])
FOLDER = Path(sys.argv[1])
def ready():
    (FOLDER / f"pid.{RANK}.tmp").write_text(str(os.getpid()))
    os.replace(FOLDER / f"pid.{RANK}.tmp", FOLDER / f"pid.{RANK}")
"""


def gone(pid: int) -> bool:
    """Neither running nor a zombie: /proc has no entry for it."""
    return not Path(f"/proc/{pid}").exists()


def processes_with(marker: str) -> list[int]:
    """Live processes whose environment holds the marker (a zombie's environ reads empty)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def rank_pids(folder: Path) -> list[int]:
    return [int((folder / f"pid.{rank}").read_text()) for rank in (0, 1)]


def start_launcher(folder: Path, script: Path, *extra: str, marker: str):
    command = [sys.executable, "-m", "mpslaunch", *TWO_CPU_RANKS, *extra, str(script), str(folder)]
    env = {**os.environ, "MPSLAUNCH_TEST_MARKER": marker}
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
    if not wait_for(lambda: all((folder / f"pid.{rank}").exists() for rank in (0, 1)), 60):
        launcher.kill()
        raise AssertionError(f"the ranks never started: {launcher.communicate()}")
    return launcher


@pytest.fixture(autouse=True)
def temporary_folder(tmp_path, monkeypatch):
    """Failed runs keep their temporary log folder: keep those inside tmp_path."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))


@pytest.fixture
def marker() -> str:
    return f"MPSLAUNCH_TEST_MARKER=run-{uuid.uuid4().hex}"


# ---------------------------------------------------------------- results


def test_gloo_all_reduce_over_two_ranks(tmp_path):
    script = write_script(tmp_path, "allreduce.py", """
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print("REPORT", json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(),
                            "sum": total.item(), "local_rank": os.environ["LOCAL_RANK"],
                            "device": os.environ["MPSLAUNCH_DEVICE"],
                            "omp": os.environ.get("OMP_NUM_THREADS")}))
dist.destroy_process_group()
""")
    result = run_cli(*TWO_CPU_RANKS, str(script), timeout=60)
    assert result.returncode == 0, result.stderr
    reports = {}
    for line in own_lines(result.stdout, "REPORT "):
        prefix, _, text = line.partition(" REPORT ")
        report = json.loads(text)
        assert prefix == f"[rank{report['rank']}]"  # console lines carry the rank
        reports[report["rank"]] = report
    assert sorted(reports) == [0, 1]
    assert {report["world"] for report in reports.values()} == {2}
    assert {report["sum"] for report in reports.values()} == {3.0}
    assert {report["device"] for report in reports.values()} == {"cpu"}
    assert [reports[rank]["local_rank"] for rank in (0, 1)] == ["0", "1"]
    assert {report["omp"] for report in reports.values()} == {str(max(1, (os.cpu_count() or 1) // 2))}
    assert "2 processes" in result.stderr


def test_unmodified_accelerate_script_sees_multi_cpu(tmp_path):
    script = write_script(tmp_path, "acc.py", """
import torch
from accelerate import Accelerator
accelerator = Accelerator()
total = accelerator.reduce(torch.tensor([1.0]), reduction="sum")
print("STATE", accelerator.distributed_type, accelerator.num_processes, accelerator.process_index,
      accelerator.state.backend, accelerator.device.type, total.item())
# Without it, torch 2.14's gloo can abort at exit (SIGABRT, "terminate called without an active
# exception"; under plain torchrun too): a torch bug, not the launcher's (pytorch PR #179291).
accelerator.end_training()
""")
    result = run_cli(*TWO_CPU_RANKS, str(script), timeout=90)
    assert two_gloo_ranks_ended_well(result), result.stderr
    states = sorted(line for line in result.stdout.splitlines() if "STATE" in line)
    assert states == ["[rank0] STATE DistributedType.MULTI_CPU 2 0 gloo cpu 2.0",
                      "[rank1] STATE DistributedType.MULTI_CPU 2 1 gloo cpu 2.0"]


def test_console_lines_stay_whole_with_one_rank_prefix(tmp_path):
    # torch's tailer reads whatever is in the file: half a line, when the rank pauses mid-line
    # (longer than the tailer's 0.1 s poll), or between the writes of one print(a, b, c).
    script = write_script(tmp_path, "chatty.py", """
import os, time
rank = os.environ["RANK"]
for index in range(3):
    print("slow", index, end="", flush=True)
    time.sleep(0.3)
    print(" from rank", rank)
for index in range(300):
    print("fast", index, "from", "rank", rank, "end")
""")
    result = run_cli(*TWO_CPU_RANKS, str(script), timeout=60)
    assert result.returncode == 0, result.stderr
    expected = {f"[rank{rank}] slow {index} from rank {rank}" for rank in (0, 1) for index in range(3)}
    expected |= {f"[rank{rank}] fast {index} from rank {rank} end" for rank in (0, 1) for index in range(300)}
    lines = result.stdout.splitlines()
    assert set(lines) == expected and len(lines) == len(expected)


def test_everything_of_a_one_machine_run_listens_on_the_loopback_only(tmp_path):
    script = write_script(tmp_path, "listeners.py", """
import json, os, psutil, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 0:
    launcher = psutil.Process(os.getppid())
    run = [launcher, *launcher.children(recursive=True)]
    listening = sorted({c.laddr.ip for p in run for c in p.net_connections("inet")
                        if c.status == psutil.CONN_LISTEN})
    print("LISTENING", json.dumps(listening))
dist.barrier()
dist.destroy_process_group()
""")
    result = run_cli(*TWO_CPU_RANKS, str(script), timeout=60)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if "LISTENING" in line)
    assert json.loads(line.split("LISTENING", 1)[1]) == ["127.0.0.1"]


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_two_machines_meet_through_torchruns_rendezvous(tmp_path, backend):
    """Two launchers on this computer play machine 0 and machine 1, one rank each."""
    script = write_script(tmp_path, "meet.py", """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print("MET", dist.get_rank(), dist.get_world_size(), total.item())
dist.destroy_process_group()
""")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "mpslaunch", "launch", "--cpu", "--num_machines", "2",
         "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port",
         str(port), "--rdzv_backend", backend, str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [launcher.communicate(timeout=90) for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], outputs
    met = sorted(line.split(" ", 1)[1] for out, _ in outputs for line in own_lines(out, "MET "))
    assert met == ["MET 0 2 3.0", "MET 1 2 3.0"]


def test_a_run_that_ends_first_leaves_another_runs_ranks_on_this_host_alone(tmp_path):
    """Two two-machine runs on one host (all four launchers here): run a ends while run b's
    ranks still work, and cleans up only what it started itself. The runs take turns with
    their gloo groups (files say when), as two gloo jobs at once on one host can meet."""
    script = write_script(tmp_path, "rank.py", """
import pathlib, sys, time, torch.distributed as dist
run, folder = sys.argv[1], pathlib.Path(sys.argv[2])
def wait_for(name):
    while not all((folder / f"{name}.{rank}").exists() for rank in (0, 1)):
        time.sleep(0.1)
if run == "b":
    wait_for("a_done_with_gloo")
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.destroy_process_group()
if run == "a":
    (folder / f"a_done_with_gloo.{rank}").touch()
    wait_for("b_done_with_gloo")  # then run a ends, while run b's ranks sleep
else:
    (folder / f"b_done_with_gloo.{rank}").touch()
    time.sleep(5)
print("DONE", rank, flush=True)
""")

    def two_machines(run: str) -> list[subprocess.Popen]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        return [subprocess.Popen(
            [sys.executable, "-m", "mpslaunch", "launch", "--cpu", "--num_machines", "2",
             "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1",
             "--main_process_port", str(port), str(script), run, str(tmp_path)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]

    launchers = two_machines("a") + two_machines("b")
    outputs = [launcher.communicate(timeout=300) for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0, 0, 0], outputs
    assert [own_lines(out, "DONE ") for out, _ in outputs] == [[f"[rank{rank}] DONE {rank}"]
                                                        for rank in (0, 1, 0, 1)]


# ---------------------------------------------------------------- failures


def test_a_ranks_exit_code_comes_back_and_the_other_rank_is_gone(tmp_path, marker):
    script = write_script(tmp_path, "exit3.py", RANK_PREAMBLE + """
ready()
if RANK == 1:
    while not (FOLDER / "pid.0").exists():
        time.sleep(0.05)
    sys.exit(3)
time.sleep(120)
""")
    launcher = start_launcher(tmp_path, script, marker=marker)
    out, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 3, err
    *_, summary, end = err.strip().splitlines()
    assert "rank 1 failed first: it exited with code 3" in summary and summary.endswith("; rank 0 was stopped")
    assert end.startswith("mpslaunch: ended after ") and ", exit code 3" in end
    assert all(gone(pid) for pid in rank_pids(tmp_path))
    assert processes_with(marker) == []
    assert "Traceback" not in err  # neither the script nor the launcher raised


def test_the_users_traceback_is_shown_once_and_the_launcher_adds_none(tmp_path):
    # With a process group, torch's excepthook prefixes the traceback with "[rank0]: " itself.
    script = write_script(tmp_path, "boom.py", """
import os, time, torch.distributed as dist
dist.init_process_group("gloo")
if os.environ["RANK"] == "0":
    raise ValueError("boom in rank zero")
time.sleep(120)
""")
    result = run_cli(*TWO_CPU_RANKS, "--log_dir", str(tmp_path / "logs"), str(script), timeout=60)
    assert result.returncode == 1
    assert result.stderr.count("ValueError: boom in rank zero") == 1
    assert "[rank0] ValueError: boom in rank zero" in result.stderr
    assert "[rank0] Traceback" in result.stderr and "[rank0]:" not in result.stderr
    assert result.stderr.count("Traceback") == 1
    assert "torch/distributed" not in result.stderr  # neither torch's log nor its error dump
    *_, summary, end = result.stderr.strip().splitlines()
    assert summary.startswith("mpslaunch: rank 0 failed first: it exited with code 1")
    assert end.startswith("mpslaunch: ended after ") and end.endswith(f"; output in {tmp_path / 'logs'}")
    stderr_log = Path(summary.split(" is in ")[1].split(";")[0])
    assert stderr_log.is_relative_to(tmp_path / "logs")
    assert "ValueError: boom in rank zero" in stderr_log.read_text()


def test_when_both_ranks_fail_the_summary_says_so(tmp_path):
    """Rank 1 fails; rank 0, told to stop, fails too (exit 5), not 'stopped'."""
    script = write_script(tmp_path, "both.py", RANK_PREAMBLE + """
if RANK == 0:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(5))
    ready()
    time.sleep(120)
while not (FOLDER / "pid.0").exists():
    time.sleep(0.05)
ready()
sys.exit(3)
""")
    result = run_cli(*TWO_CPU_RANKS, str(script), str(tmp_path), timeout=60)
    assert result.returncode == 3, result.stderr
    *_, summary, _ = result.stderr.strip().splitlines()  # the last: the run's end
    assert summary.startswith("mpslaunch: rank 1 failed first: it exited with code 3;")
    assert summary.endswith("; rank 0 also failed: it exited with code 5")


def test_a_restart_is_announced_and_counted(tmp_path):
    script = write_script(tmp_path, "flaky.py", """
import os, sys
sys.exit(7 if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" else 0)
""")
    result = run_cli(*TWO_CPU_RANKS, "-q", "--max_restarts", "1", str(script), timeout=90)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "mpslaunch: rank 1 exited with code 7; starting every rank again (restart 1 of 1)",
        "mpslaunch: every rank finished, after 1 restart of --max_restarts 1"]


@pytest.mark.skipif(sys.platform != "linux", reason="libstdc++'s std::terminate")
def test_an_abort_at_exit_after_the_script_returned_is_named(tmp_path):
    """What torch's gloo does at interpreter exit about one run in five on a busy machine
    (pytorch/pytorch#190489), made certain: std::terminate in rank 1 once its script returned."""
    script = write_script(tmp_path, "abort_at_exit.py", """
import atexit, ctypes, os
print("result of rank", os.environ["RANK"])
if os.environ["RANK"] == "1":
    atexit.register(lambda: ctypes.CDLL("libstdc++.so.6")._ZSt9terminatev())
""")
    result = run_cli(*TWO_CPU_RANKS, "-q", str(script), timeout=60)
    assert result.returncode == 134, result.stderr
    assert "[rank1] terminate called without an active exception" in result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    assert summary.startswith("mpslaunch: rank 1 failed first: it aborted in torch's exit after the "
                              "script had returned (SIGABRT, exit code 134")
    assert "https://github.com/pytorch/pytorch/issues/190489" in summary


def test_a_rank_killed_by_a_signal_gives_128_plus_n(tmp_path):
    script = write_script(tmp_path, "killed.py", """
import os, signal, time
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
""")
    result = run_cli(*TWO_CPU_RANKS, str(script), timeout=60)
    assert result.returncode == 128 + signal.SIGKILL
    assert "rank 1 failed first: it was killed by SIGKILL (exit code 137)" in result.stderr


# ---------------------------------------------------------------- signals


def test_sigterm_to_the_launcher_stops_every_rank(tmp_path, marker):
    script = write_script(tmp_path, "wait.py", RANK_PREAMBLE + "ready()\ntime.sleep(120)\n")
    launcher = start_launcher(tmp_path, script, marker=marker)
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 143, err
    assert "stopped by SIGTERM" in err
    assert all(gone(pid) for pid in rank_pids(tmp_path))
    assert processes_with(marker) == []


def test_sigusr1_is_forwarded_to_every_rank(tmp_path, marker):
    script = write_script(tmp_path, "usr1.py", RANK_PREAMBLE + """
def note(signum, frame):
    (FOLDER / f"usr1.{RANK}").write_text("got it")
signal.signal(signal.SIGUSR1, note)
ready()
time.sleep(120)
""")
    launcher = start_launcher(tmp_path, script, marker=marker)
    launcher.send_signal(signal.SIGUSR1)
    got = wait_for(lambda: all((tmp_path / f"usr1.{rank}").exists() for rank in (0, 1)), 20)
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert got, err
    assert launcher.returncode == 130
    assert processes_with(marker) == []


def test_ranks_that_ignore_sigterm_are_killed_after_the_grace_period(tmp_path, marker):
    script = write_script(tmp_path, "stubborn.py", RANK_PREAMBLE + """
signal.signal(signal.SIGTERM, signal.SIG_IGN)
ready()
time.sleep(120)
""")
    launcher = start_launcher(tmp_path, script, "--grace_period", "1", marker=marker)
    launcher.send_signal(signal.SIGTERM)
    # torch's default would wait 30 s before SIGKILL; a 1 s grace period ends well within 20.
    _, err = launcher.communicate(timeout=20)
    assert launcher.returncode == 143, err  # as on the one-process path (test_faults)
    assert "stopped by SIGTERM; some ranks did not stop in time (--grace_period) and were killed" in err
    assert all(gone(pid) for pid in rank_pids(tmp_path))


# ---------------------------------------------------------------- set-up


def test_dry_run_shows_the_torchrun_command_and_each_ranks_environment(tmp_path):
    script = write_script(tmp_path, "train.py", "")
    code = ("import sys; from mpslaunch.commands import main; code = main(sys.argv[1:]); "
            "print('TORCH IMPORTED' if 'torch' in sys.modules else 'NO TORCH'); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", code, "launch", "--dry-run", "--cpu",
                             "--num_processes", "2", str(script), "--epochs", "3"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "-m torch.distributed.run --nnodes 1 --nproc-per-node 2" in out
    assert "--master-addr 127.0.0.1" in out
    assert f"{script} --epochs 3" in out
    assert "local rank 0: RANK=0 LOCAL_RANK=0" in out
    assert "local rank 1: RANK=1 LOCAL_RANK=1 GROUP_RANK=0 WORLD_SIZE=2" in out
    assert "ACCELERATE_USE_CPU=true" in out
    assert "GLOO_SOCKET_IFNAME=" in out
    assert out.strip().endswith("NO TORCH")


def test_a_taken_port_is_a_usage_error(tmp_path):
    script = write_script(tmp_path, "never.py", "open(__file__ + '.ran', 'w')\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(*TWO_CPU_RANKS, "--main_process_port", str(port), str(script), timeout=60)
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not Path(str(script) + ".ran").exists()


def test_a_second_signal_kills_the_ranks_at_once(tmp_path, marker):
    script = write_script(tmp_path, "stubborn.py", RANK_PREAMBLE + """
signal.signal(signal.SIGTERM, signal.SIG_IGN)
ready()
time.sleep(120)
""")
    launcher = start_launcher(tmp_path, script, marker=marker)  # default grace: 30 s
    launcher.send_signal(signal.SIGTERM)
    time.sleep(1)  # torch's agent is now waiting for the ranks to stop
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=20)
    assert launcher.returncode == 143, err
    assert all(gone(pid) for pid in rank_pids(tmp_path))
    assert processes_with(marker) == []
