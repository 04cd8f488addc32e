"""`srun mpslaunch launch` on the local SLURM (two nodes on this host), with no machine flags: node
mode (one task per node, torch's agent on each) and rank mode (two tasks per node, each one rank,
no agent) train one world; a batch script without srun is refused; SLURM's signals reach every
rank once; a rank that fails on the second node gives srun its own exit code."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, wait_for, write_script

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The nodes share this host, whose name stands for 127.0.0.1 only: gloo is told its interface
# (the plan refuses several machines otherwise, as it would on two real hosts named so).
LOOPBACK = {"GLOO_SOCKET_IFNAME": "lo"}
MODES = {"node": ("--ntasks-per-node=1", "--num_processes", "2"), "rank": ("--ntasks-per-node=2",)}

# An unmodified Accelerate script: each rank adds its number in an all-reduce and gathers the
# process indexes, then says where it ran and whether torch's agent started it (its variables,
# and torch loaded in its parent). os._exit: torch can abort at interpreter exit after gloo
# (pytorch/pytorch#190489), which is not what these tests are about.
WORLD = """
import json, os, torch, torch.distributed as dist
from accelerate import Accelerator
accelerator = Accelerator()
total = torch.tensor([float(accelerator.process_index + 1)])
dist.all_reduce(total)
gathered = accelerator.gather(torch.tensor([accelerator.process_index]))
with open(f"/proc/{os.getppid()}/maps") as maps:
    parent_has_torch = "libtorch" in maps.read()
print("world " + json.dumps({
    "rank": accelerator.process_index, "world": accelerator.num_processes,
    "local": accelerator.local_process_index, "node": os.environ["SLURMD_NODENAME"],
    "sum": total.item(), "gathered": gathered.tolist(), "parent_has_torch": parent_has_torch,
    "agent_variables": sorted(key for key in os.environ if key.startswith("TORCHELASTIC_"))}), flush=True)
os._exit(0)
"""


def srun(cluster, mode: str, *launch: str, cwd: Path, timeout: float = 150):
    return cluster.run("srun", "-N2", *MODES[mode][:1], sys.executable, "-m", "mpslaunch",
                       "launch", "--cpu", *MODES[mode][1:], *launch, cwd=cwd, timeout=timeout,
                       env=LOOPBACK)


def worlds(output: str) -> list[dict]:
    found = [json.loads(line.split("world ", 1)[1]) for line in output.splitlines() if "world {" in line]
    return sorted(found, key=lambda rank: rank["rank"])


@pytest.mark.parametrize("mode", ["node", "rank"])
def test_srun_trains_one_world_of_four_ranks_with_no_machine_flags(slurm_cluster, tmp_path, mode):
    script = write_script(tmp_path, "world.py", WORLD)
    ran = srun(slurm_cluster, mode, str(script), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    ranks = worlds(ran.stdout)
    assert [rank["rank"] for rank in ranks] == [0, 1, 2, 3], ran.stdout
    for rank in ranks:
        assert (rank["world"], rank["sum"], rank["gathered"]) == (4, 10.0, [0, 1, 2, 3])
        assert rank["node"] == ("node01" if rank["rank"] < 2 else "node02")
        assert rank["local"] == rank["rank"] % 2
        # Node mode: torch's agent, in each node's launcher, started the ranks; rank mode: none.
        assert rank["parent_has_torch"] == (mode == "node")
        assert bool(rank["agent_variables"]) == (mode == "node")
    plan_lines = [line for line in ran.stderr.splitlines() if "slurm job" in line]
    if mode == "node":
        assert len(plan_lines) == 2 and any("node 2 of 2 (node02), main node01:" in line for line in plan_lines)
    else:  # rank 0 speaks for every task
        assert len(plan_lines) == 1 and "rank 0 of 4 (node01, local rank 0)" in plan_lines[0]


def test_a_batch_script_of_two_nodes_without_srun_is_refused_in_one_line(slurm_cluster, tmp_path):
    script = write_script(tmp_path, "world.py", WORLD)
    job = slurm_cluster.sbatch("-N2", f"--output={tmp_path}/out", f"--chdir={tmp_path}", "--wrap",
                               f"{sys.executable} -m mpslaunch launch --cpu {script}")
    ended = slurm_cluster.wait_for_end(job)
    assert (ended["JobState"], ended["ExitCode"]) == ("FAILED", "2:0")
    assert (tmp_path / "out").read_text().splitlines() == [
        f"mpslaunch: error: this is the batch script of SLURM job {job}, outside any srun step, "
        "and the job has 2 nodes: a launch here would train alone while the job's other nodes "
        "wait; start it on every node with srun (`srun --ntasks-per-node=1 mpslaunch launch "
        "...`), or give --no_slurm to ignore SLURM and run here alone"]


def test_the_batch_file_of_the_docs_runs_as_written(slurm_cluster, tmp_path):
    """docs/several-machines.md's batch file, word for word: one srun line, no machine flag."""
    docs = (REPO / "docs" / "several-machines.md").read_text()
    batch_file = re.search(r"A batch file:\n\n```sh\n(.*?)```", docs, re.DOTALL).group(1)
    (tmp_path / "train.sbatch").write_text(batch_file)
    write_script(tmp_path, "train.py", WORLD)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # mpslaunch on PATH
    job = slurm_cluster.sbatch(f"--output={tmp_path}/out", f"--chdir={tmp_path}", "train.sbatch",
                               cwd=tmp_path, env={**LOOPBACK, "PATH": path})
    ended = slurm_cluster.wait_for_end(job, seconds=150)
    output = (tmp_path / "out").read_text()
    assert (ended["JobState"], ended["ExitCode"]) == ("COMPLETED", "0:0"), output[-3000:]
    ranks = worlds(output)  # one process on each CPU node
    assert [(rank["rank"], rank["node"], rank["sum"]) for rank in ranks] == [(0, "node01", 3.0),
                                                                            (1, "node02", 3.0)]


# Each rank notes every signal it gets; on SIGTERM it saves (a second later) and exits 143.
NOTE_SIGNALS = """
import os, signal, sys, time
folder = sys.argv[1]
def note(what):
    with open(os.path.join(folder, "notes"), "a") as out:
        out.write(f"{os.environ['SLURM_JOB_ID']} {os.environ['RANK']} {what}\\n")
def received(number, frame):
    note(signal.Signals(number).name)
    if number == signal.SIGTERM:
        time.sleep(1)
        note("saved")
        sys.exit(143)
signal.signal(signal.SIGUSR1, received)
signal.signal(signal.SIGTERM, received)
note("started")
while True:
    time.sleep(0.1)
"""


def notes(folder: Path, what: str) -> list[str]:
    text = (folder / "notes").read_text() if (folder / "notes").exists() else ""
    return sorted(line.split()[1] for line in text.splitlines() if line.endswith(f" {what}"))


@pytest.mark.parametrize("mode", ["node", "rank"])
def test_scancel_signals_reach_every_rank_once_and_the_run_ends_143_after_saving(slurm_cluster, tmp_path, mode):
    """slurmstepd signals every process of the step, the ranks too: the launcher forwards
    nothing, and torch's agent sends no second SIGTERM."""
    script = write_script(tmp_path, "note_signals.py", NOTE_SIGNALS)
    command = ["srun", "-N2", MODES[mode][0], sys.executable, "-m", "mpslaunch", "launch", "--cpu",
               *MODES[mode][1:], "--grace_period", "4", str(script), str(tmp_path)]
    srun_process = subprocess.Popen(command, env=slurm_cluster.environ(**LOOPBACK), cwd=tmp_path,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: notes(tmp_path, "started") == ["0", "1", "2", "3"], 90), notes(tmp_path, "started")
        job = (tmp_path / "notes").read_text().split()[0]
        assert slurm_cluster.run("scancel", "--signal=USR1", job).returncode == 0
        assert wait_for(lambda: len(notes(tmp_path, "SIGUSR1")) >= 4, 30)
        assert slurm_cluster.run("scancel", job).returncode == 0
        _, stderr = srun_process.communicate(timeout=60)
        assert srun_process.returncode == 143, stderr[-3000:]
        assert notes(tmp_path, "SIGUSR1") == ["0", "1", "2", "3"]
        assert notes(tmp_path, "SIGTERM") == ["0", "1", "2", "3"]
        assert notes(tmp_path, "saved") == ["0", "1", "2", "3"]
    finally:
        srun_process.kill()
        srun_process.communicate()


# The last rank (on the second node) fails with code 3; the others lose it in the all-reduce and
# end with 1 (os._exit: see WORLD).
FAILS_ON_NODE_2 = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == dist.get_world_size() - 1:
    sys.exit(3)
try:
    dist.all_reduce(torch.ones(1))
except RuntimeError:
    print(f"rank {rank} stopped: a peer is gone", flush=True)
    os._exit(1)
"""


@pytest.mark.parametrize("mode", ["node", "rank"])
def test_a_rank_failing_on_the_second_node_gives_srun_its_code_and_stops_the_first(slurm_cluster, tmp_path, mode):
    script = write_script(tmp_path, "fails.py", FAILS_ON_NODE_2)
    ran = srun(slurm_cluster, mode, str(script), cwd=tmp_path)
    assert ran.returncode == 3, ran.stderr[-3000:]
    stopped = sorted(line.split("rank ", 1)[1][0] for line in ran.stdout.splitlines() if "a peer is gone" in line)
    assert stopped == ["0", "1", "2"], ran.stdout
