"""The SLURM step and allocation read from the environment (machine/slurm.py), on environments
SLURM set on the local two-node cluster (slurm 22.05; tests/slurm/ checks the live ones)."""

from __future__ import annotations

import pytest

from helpers import SLURM_JOB as JOB, slurm_task as task
from mpslaunch.machine import (SlurmVariableError, in_slurm_step, kill_wait_from_config,
                               slurm_allocation, slurm_step)

def test_each_task_of_a_two_node_step_reads_its_place():
    for procid, nodeid, localid, node in [(0, 0, 0, "node01"), (1, 0, 1, "node01"),
                                          (2, 1, 0, "node02"), (3, 1, 1, "node02")]:
        step = slurm_step(task(procid, nodeid, localid, node))
        assert (step.global_rank, step.node_rank, step.local_rank, step.node_name) == (procid, nodeid, localid, node)
        assert (step.job_id, step.step_id, step.job_name) == ("31", "0", "python")
        assert (step.num_nodes, step.num_tasks, step.tasks_per_node) == (2, 4, (2, 2))
        assert step.nodes == ("node01", "node02") and step.main_node == "node01"
        assert step.tasks_on_each_node == 2 and step.node_list_error is None
        assert not step.heterogeneous
        assert slurm_allocation(task(procid, nodeid, localid, node)) is None


def test_the_step_is_read_from_the_steps_variables_not_the_jobs():
    """A step of one node in a job of two: SLURM_NNODES says the step's count, SLURM_JOB_NUM_NODES
    and SLURM_NTASKS the job's; only the step's variables are read."""
    environ = task(0, 0, 0, "node01", SLURM_STEP_NODELIST="node01", SLURM_STEP_NUM_NODES="1",
                   SLURM_STEP_NUM_TASKS="1", SLURM_STEP_TASKS_PER_NODE="1", SLURM_NNODES="1")
    step = slurm_step(environ)
    assert (step.num_nodes, step.num_tasks, step.tasks_per_node, step.nodes) == (1, 1, (1,), ("node01",))


def test_uneven_tasks_per_node_are_read_as_they_are():
    step = slurm_step(task(2, 1, 0, "node02", SLURM_STEP_NUM_TASKS="3", SLURM_STEP_TASKS_PER_NODE="2,1"))
    assert step.tasks_per_node == (2, 1) and step.tasks_on_each_node is None


def test_mixed_names_give_the_first_host_as_main_node():
    step = slurm_step(task(0, 0, 0, "gpu-a", SLURM_STEP_NODELIST="gpu-a,node[01,07]", SLURM_STEP_NUM_NODES="3",
                           SLURM_STEP_NUM_TASKS="3", SLURM_STEP_TASKS_PER_NODE="1(x3)"))
    assert step.nodes == ("gpu-a", "node01", "node07") and step.main_node == "gpu-a"


@pytest.mark.parametrize("node_list,error", [
    ("dgx[1-2]-ib", "text after the last bracket"),
    ("node[01-03]", "names 3 nodes and SLURM_STEP_NUM_NODES=2"),
])
def test_a_node_list_that_cannot_be_read_is_a_fact_with_its_reason(node_list, error):
    step = slurm_step(task(0, 0, 0, "node01", SLURM_STEP_NODELIST=node_list))
    assert step.nodes == () and step.main_node is None
    assert error in step.node_list_error
    assert step.num_nodes == 2 and step.global_rank == 0  # the rest is read


def test_a_batch_script_without_srun_is_not_a_step():
    """sbatch -N2 --ntasks-per-node=1: the script has SLURM_PROCID=0, SLURM_NODEID=0 and
    SLURM_NTASKS=2, which look like rank 0 of 2, but no SLURM_STEP_ID."""
    environ = {**JOB, "ENVIRONMENT": "BATCH", "SLURM_JOB_NAME": "wrap", "SLURM_PROCID": "0",
               "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2",
               "SLURM_NTASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURMD_NODENAME": "node01"}
    assert not in_slurm_step(environ) and slurm_step(environ) is None
    allocation = slurm_allocation(environ)
    assert (allocation.job_id, allocation.job_name, allocation.batch) == ("31", "wrap", True)
    assert (allocation.num_nodes, allocation.num_tasks, allocation.node_list) == (2, 2, "node[01-02]")
    assert not allocation.heterogeneous


def test_a_batch_script_asked_for_nodes_only_has_no_task_count():
    environ = {**JOB, "ENVIRONMENT": "BATCH", "SLURM_PROCID": "0", "SLURM_NODEID": "0"}
    assert slurm_allocation(environ).num_tasks is None
    assert slurm_allocation(environ).num_nodes == 2


def test_an_salloc_shell_is_an_allocation_but_not_a_batch_script():
    environ = {**JOB, "SLURM_JOB_NAME": "interactive", "SLURM_TASKS_PER_NODE": "1(x2)"}
    allocation = slurm_allocation(environ)
    assert allocation.batch is False and allocation.num_nodes == 2 and allocation.num_tasks is None


def test_outside_slurm_there_is_neither():
    assert slurm_step({"PATH": "/usr/bin"}) is None and slurm_allocation({"PATH": "/usr/bin"}) is None


HETEROGENEOUS = {"SLURM_HET_SIZE": "2", "SLURM_PACK_SIZE": "2", "SLURM_JOB_ID_HET_GROUP_0": "10",
                 "SLURM_JOB_ID_HET_GROUP_1": "11", "SLURM_JOB_NODELIST_HET_GROUP_0": "node01",
                 "SLURM_JOB_NODELIST_HET_GROUP_1": "node02"}


@pytest.mark.parametrize("marks", [HETEROGENEOUS, {"SLURM_HET_SIZE": "2"}, {"SLURM_PACK_SIZE": "2"},
                                   {"SLURM_JOB_NODELIST_PACK_GROUP_1": "node02"}])
def test_a_heterogeneous_job_is_known_in_a_step_and_in_its_allocation(marks):
    assert slurm_step(task(0, 0, 0, "node01", **marks)).heterogeneous
    assert slurm_allocation({**JOB, **marks}).heterogeneous


def test_an_ordinary_jobs_component_zero_variable_is_not_heterogeneous():
    """An srun step inside `sbatch -N2 --ntasks-per-node=1` (slurm 22.05) has
    SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0=1(x2)."""
    environ = task(0, 0, 0, "node01", SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0="1(x2)")
    assert not slurm_step(environ).heterogeneous
    assert not slurm_allocation({**JOB, "SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0": "1(x2)"}).heterogeneous


@pytest.mark.parametrize("change,named", [
    ({"SLURM_STEP_NUM_NODES": "two"}, "SLURM_STEP_NUM_NODES='two' is not a whole number"),
    ({"SLURM_STEP_NODELIST": ""}, "SLURM_STEP_NODELIST"),
    ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x)"}, "SLURM_STEP_TASKS_PER_NODE='2(x)' cannot be read"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "counts 3 nodes, SLURM_STEP_NUM_NODES=2"),
    ({"SLURM_STEP_NUM_TASKS": "5"}, "counts 4 tasks, SLURM_STEP_NUM_TASKS=5"),
    ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 with 2 nodes"),
    ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4 with 4 tasks"),
    ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 on a node of 2 tasks"),
    ({"SLURM_LOCALID": "-1"}, "SLURM_LOCALID='-1' is not a whole number"),
])
def test_a_step_whose_variables_cannot_be_read_names_the_variable(change, named):
    with pytest.raises(SlurmVariableError) as refused:
        slurm_step(task(0, 0, 0, "node01", **change))
    assert named in str(refused.value) and "\n" not in str(refused.value)


def test_missing_step_variables_are_named():
    environ = task(0, 0, 0, "node01")
    del environ["SLURM_STEP_NUM_TASKS"]
    with pytest.raises(SlurmVariableError, match="not SLURM_STEP_NUM_TASKS"):
        slurm_step(environ)


def test_kill_wait_is_read_from_scontrols_config():
    shown = "KeepAliveTime           = SYSTEM_DEFAULT\nKillOnBadExit           = 0\nKillWait                = 5 sec\n"
    assert kill_wait_from_config(shown) == 5
    assert kill_wait_from_config("KillOnBadExit = 0\n") is None
