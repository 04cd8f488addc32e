"""The command line in a SLURM step described by its variables (set by the test, as SLURM sets
them; no SLURM runs): --dry_run names the step and where each value came from, refusals are one
line naming both sources, and `mpslaunch env` shows the job. tests/slurm/ runs real steps."""

from __future__ import annotations

import pytest

from helpers import SLURM_JOB, one_line_error, run_cli, slurm_step_of, write_script

pytestmark = pytest.mark.slow  # every test here starts processes

# This host's name stands for 127.0.0.1 only (as on the test machines), which the plan refuses
# for several machines unless gloo is told its interface; the local SLURM's nodes share it.
LOOPBACK = {"GLOO_SOCKET_IFNAME": "lo"}


def in_step(rank: int, per_node: int, **extra: str) -> dict[str, str]:
    environ = {**slurm_step_of(rank, per_node, **extra), **LOOPBACK}
    del environ["PATH"]  # the test's own
    return environ


@pytest.fixture
def script(tmp_path):
    return write_script(tmp_path, "train.py", "print('trained')\n")


def test_dry_run_in_node_mode_names_slurm_for_each_value(script):
    shown = run_cli("launch", "--cpu", "--num_processes", "2", "--dry_run", str(script),
                    env=in_step(1, per_node=1))
    assert shown.returncode == 0, shown.stderr
    assert "processes:       2 per machine (--num_processes), 2 machines (SLURM_STEP_NUM_NODES)" in shown.stdout
    assert "machine rank:    1 (SLURM_NODEID)" in shown.stdout
    assert "main address:    node01 (SLURM_STEP_NODELIST), port " in shown.stdout
    assert "cluster:         slurm job 31: node 2 of 2 (node02), main node01:" in shown.stdout
    assert "--nnodes 2 --nproc-per-node 2 --rdzv-backend static" in shown.stdout
    assert "--node-rank 1 --master-addr node01" in shown.stdout


def test_dry_run_in_rank_mode_shows_the_ranks_variables_and_no_torchrun(script):
    shown = run_cli("launch", "--cpu", "--dry_run", str(script), env=in_step(3, per_node=2))
    assert shown.returncode == 0, shown.stderr
    assert "cluster:         slurm job 31: rank 3 of 4 (node02, local rank 1)" in shown.stdout
    assert "engine:          single" in shown.stdout and "torch.distributed.run" not in shown.stdout
    for line in ("  RANK=3", "  LOCAL_RANK=1", "  WORLD_SIZE=4", "  LOCAL_WORLD_SIZE=2",
                 "  GROUP_RANK=1", "  MASTER_ADDR=node01"):
        assert line in shown.stdout.splitlines()


def test_rank_zero_says_the_plan_and_the_other_ranks_only_their_failure(tmp_path):
    ending = write_script(tmp_path, "end.py", "import os, sys\nsys.exit(int(os.environ['RANK']))\n")
    # Rank 0 checks that the first node is one of its own addresses: here, `localhost` (the
    # local SLURM's node names resolve only while it runs).
    first = run_cli("launch", "--cpu", str(ending),
                    env=in_step(0, per_node=2, nodes=("localhost", "node02"), node_list="localhost,node02"))
    assert first.returncode == 0, first.stderr
    assert "slurm job 31: rank 0 of 4 (localhost, local rank 0)" in first.stderr
    assert "exit code 0" in first.stderr
    other = run_cli("launch", "--cpu", str(ending), env=in_step(3, per_node=2))
    assert other.returncode == 3
    assert "slurm job" not in other.stderr and "exit code 3" in other.stderr


def test_a_contradicting_flag_is_refused_in_one_line_naming_both_sources(script):
    line = one_line_error(run_cli("launch", "--cpu", "--machine_rank", "0", str(script),
                                  env=in_step(1, per_node=1)))
    assert line == ("mpslaunch: error: --machine_rank 0 contradicts SLURM's node rank 1 "
                    "(SLURM_NODEID); drop --machine_rank, or give --no_slurm to ignore SLURM")


def test_no_slurm_runs_the_script_here_alone(script):
    ran = run_cli("launch", "--cpu", "--no_slurm", str(script), env=in_step(1, per_node=1))
    assert ran.returncode == 0 and ran.stdout == "trained\n"
    assert "slurm job" not in ran.stderr


def test_a_batch_script_of_two_nodes_is_refused_before_anything_runs(script):
    environ = {key: value for key, value in SLURM_JOB.items() if key != "PATH"}
    environ.update(ENVIRONMENT="BATCH", SLURM_JOB_NAME="wrap", SLURM_PROCID="0", SLURM_NODEID="0",
                   SLURM_NTASKS="2")
    ran = run_cli("launch", "--cpu", str(script), env=environ)
    line = one_line_error(ran)
    assert "batch script of SLURM job 31, outside any srun step, and the job has 2 nodes" in line
    assert "`srun --ntasks-per-node=1 mpslaunch launch ...`" in line
    assert "trained" not in ran.stdout


def test_env_shows_the_step_and_what_launch_would_do_in_it():
    shown = run_cli("env", "--timeout", "60", env=in_step(3, per_node=2))
    assert shown.returncode == 0, shown.stderr
    assert ("- SLURM: srun step: job 31, step 0 (python): task 3 of 4 on node02, node 2 of 2 "
            "(node[01-02]), 2 tasks on each node") in shown.stdout
    assert "slurm job 31: rank 3 of 4 (node02, local rank 1)" in shown.stdout


def test_env_outside_slurm_says_none():
    shown = run_cli("env", "--json", "--timeout", "60")
    assert '"slurm": "none"' in shown.stdout
