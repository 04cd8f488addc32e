"""The local SLURM (local_slurm.sh) and the facts of SLURM that mpslaunch reads, on real jobs: the
environment inside an srun step, in a batch script without srun and in an salloc shell, read by
machine/slurm.py; which processes SLURM's signals reach; what srun makes of its tasks' ends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import local_slurm, wait_for, write_script
from mpslaunch.machine import kill_wait_seconds

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# Prints what machine/slurm.py reads in this process's environment, as one JSON line.
READ_SLURM = """
import json, os
from mpslaunch.machine import slurm_allocation, slurm_step
step, allocation = slurm_step(os.environ), slurm_allocation(os.environ)
print(json.dumps({"step": step and step._asdict(),
                  "allocation": allocation and allocation._asdict()}))
"""


def readings(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_start_when_running_says_so(slurm_cluster):
    again = local_slurm("start", timeout=30)
    assert again.returncode == 0 and "already running" in again.stdout
    assert f"export SLURM_CONF={slurm_cluster.conf}" in again.stdout


@pytest.mark.parametrize("per_node", [1, 2])
def test_every_task_of_a_two_node_step_reads_its_place(slurm_cluster, tmp_path, per_node):
    ran = slurm_cluster.run("srun", "-N2", f"--ntasks-per-node={per_node}", sys.executable, "-c",
                            READ_SLURM, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    steps = sorted((reading["step"] for reading in readings(ran.stdout)), key=lambda step: step["global_rank"])
    assert [step["global_rank"] for step in steps] == list(range(2 * per_node))
    for step in steps:
        assert step["nodes"] == ["node01", "node02"] and step["node_list_error"] is None
        assert (step["num_nodes"], step["num_tasks"]) == (2, 2 * per_node)
        assert step["tasks_per_node"] == [per_node, per_node]
        # SLURM places tasks in blocks: the first node holds ranks 0..per_node-1.
        assert step["node_rank"] == step["global_rank"] // per_node
        assert step["local_rank"] == step["global_rank"] % per_node
        assert step["node_name"] == step["nodes"][step["node_rank"]]
        assert not step["heterogeneous"]
    assert all(reading["allocation"] is None for reading in readings(ran.stdout))


def test_a_batch_script_without_srun_is_an_allocation_not_a_step(slurm_cluster, tmp_path):
    job = slurm_cluster.sbatch("-N2", "--ntasks-per-node=1", f"--output={tmp_path}/out",
                               f"--chdir={tmp_path}", "--wrap", f"{sys.executable} -c '{READ_SLURM}'")
    assert slurm_cluster.wait_for_end(job)["JobState"] == "COMPLETED"
    [reading] = readings((tmp_path / "out").read_text())
    assert reading["step"] is None
    allocation = reading["allocation"]
    assert (allocation["job_id"], allocation["batch"], allocation["num_nodes"], allocation["num_tasks"]) == (job, True, 2, 2)
    assert allocation["node_list"] == "node[01-02]"


def test_an_salloc_shell_is_an_allocation_not_a_step(slurm_cluster, tmp_path):
    ran = slurm_cluster.run("salloc", "-N2", sys.executable, "-c", READ_SLURM, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    [reading] = readings(ran.stdout)
    assert reading["step"] is None
    allocation = reading["allocation"]
    assert (allocation["batch"], allocation["num_nodes"], allocation["num_tasks"]) == (False, 2, None)


# Each task starts a child in a session of its own (setsid) and a plain child; every process
# writes one line per signal it receives, and ends on SIGTERM.
NOTE_SIGNALS = """
import os, signal, subprocess, sys, time
folder, role = sys.argv[1], sys.argv[2]
def note(what):
    with open(os.path.join(folder, "signals"), "a") as out:
        out.write(f"{os.environ['SLURM_JOB_ID']} {os.environ['SLURM_PROCID']} {role} {what}\\n")
def received(number, frame):
    note(signal.Signals(number).name)
    if number == signal.SIGTERM:
        sys.exit(143)
signal.signal(signal.SIGUSR1, received)
signal.signal(signal.SIGTERM, received)
if role == "task":
    subprocess.Popen(["setsid", sys.executable, __file__, folder, "own-session"])
    subprocess.Popen([sys.executable, __file__, folder, "child"])
note("started")
while True:
    time.sleep(0.1)
"""


def signal_lines(folder: Path, what: str) -> list[str]:
    text = (folder / "signals").read_text() if (folder / "signals").exists() else ""
    return sorted(line.split(" ", 1)[1] for line in text.splitlines() if line.endswith(what))


def test_scancel_signals_reach_every_process_of_the_step_once(slurm_cluster, tmp_path):
    """slurmstepd signals every process of the step (proctrack/linuxproc), a child that left for
    a session of its own too: `scancel --signal=USR1` once each, `scancel` SIGTERM once each."""
    script = write_script(tmp_path, "note_signals.py", NOTE_SIGNALS)
    srun = subprocess.Popen(["srun", "-N2", sys.executable, str(script), str(tmp_path), "task"],
                            env=slurm_cluster.environ(), cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(signal_lines(tmp_path, "started")) == 6, 30), signal_lines(tmp_path, "started")
        job = (tmp_path / "signals").read_text().split()[0]
        everyone = [f"{task} {role}" for task in "01" for role in ("child", "own-session", "task")]
        assert slurm_cluster.run("scancel", "--signal=USR1", job).returncode == 0
        assert wait_for(lambda: len(signal_lines(tmp_path, "SIGUSR1")) >= 6, 30)
        assert slurm_cluster.run("scancel", job).returncode == 0
        assert srun.wait(timeout=30) == 143
        assert signal_lines(tmp_path, "SIGUSR1") == [f"{who} SIGUSR1" for who in everyone]
        assert signal_lines(tmp_path, "SIGTERM") == [f"{who} SIGTERM" for who in everyone]
    finally:
        srun.kill()
        srun.communicate()


def test_srun_exits_with_the_largest_exit_code_of_its_tasks(slurm_cluster, tmp_path):
    """What the next layer builds on: srun waits for every task and gives the largest code, so a
    launcher stopped because another failed must end with a smaller code than the failure's."""
    ran = slurm_cluster.run("srun", "-N2", "bash", "-c", "exit $((SLURM_PROCID == 1 ? 3 : 0))", cwd=tmp_path)
    assert ran.returncode == 3
    ran = slurm_cluster.run("srun", "-N2", "bash", "-c", "exit $((SLURM_PROCID + 4))", cwd=tmp_path)
    assert ran.returncode == 5


def test_sigterm_to_srun_kills_the_tasks_at_once(slurm_cluster, tmp_path):
    """SIGTERM (or SIGHUP) to srun itself cancels the step with SIGKILL: no task sees a SIGTERM,
    so no grace period. scancel, or srun's double Ctrl-C, give the tasks a signal first."""
    script = write_script(tmp_path, "note_signals.py", NOTE_SIGNALS)
    srun = subprocess.Popen(["srun", "-N1", sys.executable, str(script), str(tmp_path), "task"],
                            env=slurm_cluster.environ(), cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(signal_lines(tmp_path, "started")) == 3, 30)
        srun.send_signal(signal.SIGTERM)
        assert srun.wait(timeout=30) == 128 + signal.SIGKILL
        assert signal_lines(tmp_path, "SIGTERM") == []
    finally:
        srun.kill()
        srun.communicate()


def test_kill_wait_comes_from_the_cluster(slurm_cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)
    assert kill_wait_seconds() == 5  # what local_slurm.sh configures
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    assert kill_wait_seconds(timeout=1) is None
