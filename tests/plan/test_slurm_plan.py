"""The plan inside a SLURM step (plan/slurm.py), on environments SLURM sets: node mode (one task
per node: each task a machine), rank mode (k tasks per node: each task one rank, no torch agent),
what SLURM cannot run, and where each value came from. tests/slurm/ runs them on a real SLURM."""

from __future__ import annotations

import pytest

from helpers import MACHINES, SLURM_JOB, refusal_of, slurm_step_of, slurm_task
from mpslaunch.plan import (NO_CLUSTER, decide_settings, derived_port, for_target, settle,
                            slurm_cluster, with_slurm_config)
from mpslaunch.settings import (CLUSTER, DEFAULT, LaunchRequest, Profile, merge, options_layer,
                                profile_layer)


def plan_in(environ, request=None, machine="linux_cpu", profile: Profile | None = None):
    """The plan `mpslaunch launch` makes in this environment (launcher/prepare.py's layers: the
    derived port, the profile, the options, the step's facts), without probing this machine."""
    request = request or LaunchRequest("train.py", cpu=True)
    user = (profile_layer(profile or Profile(), "p.yaml"), options_layer(request))
    cluster = slurm_cluster(merge(*user), environ)
    settings = settle(cluster.derived, *user, cluster.facts)
    described = MACHINES[machine]
    decision = decide_settings(settings, request, described, environ, cluster.place)
    return for_target(decision, request, described)


def refusal_in(environ, request=None, machine="linux_cpu", profile=None) -> str | None:
    return refusal_of(lambda: plan_in(environ, request, machine, profile))


# ---------------------------------------------------------------- node mode


def test_one_task_per_node_is_a_machine_of_the_run_with_no_flag():
    plan = plan_in(slurm_step_of(1, per_node=1), LaunchRequest("train.py", cpu=True, num_processes=2))
    settings = plan.settings
    assert (settings.num_machines, settings.machine_rank, settings.main_process_ip) == (2, 1, "node01")
    assert settings.main_process_port == derived_port("31", "0")
    assert plan.engine == "torchrun" and plan.world_size == 4 and not plan.rank_mode
    assert settings.named("machine_rank") == "SLURM's node rank 1 (SLURM_NODEID)"
    assert settings.origin("num_machines") == "SLURM_STEP_NUM_NODES"
    assert settings.origin("main_process_port") == "derived from SLURM job 31"
    port = settings.main_process_port
    assert plan.cluster.line(settings) == f"slurm job 31: node 2 of 2 (node02), main node01:{port}"
    assert plan.summary().endswith(f"; slurm job 31: node 2 of 2 (node02), main node01:{port}")
    text = plan.describe()
    assert "machine rank:    1 (SLURM_NODEID)" in text
    assert f"main address:    node01 (SLURM_STEP_NODELIST), port {port} (derived from SLURM job 31)" in text
    assert "rendezvous:      static (default)" in text


def test_every_task_of_a_step_derives_the_same_port_and_steps_differ():
    ports = {plan_in(slurm_step_of(rank, per_node=1)).settings.main_process_port for rank in (0, 1)}
    assert len(ports) == 1 and 20000 <= ports.pop() < 30000
    assert derived_port("31", "0") != derived_port("31", "1")


def test_master_port_is_taken_as_the_port_and_a_flag_may_change_a_derived_one():
    plan = plan_in(slurm_step_of(0, per_node=1, MASTER_PORT="29600"))
    assert plan.settings.main_process_port == 29600
    assert plan.settings.named("main_process_port") == "MASTER_PORT=29600 in the environment"
    flagged = plan_in(slurm_step_of(0, per_node=1), LaunchRequest("t.py", cpu=True, main_process_port=29700))
    assert flagged.settings.main_process_port == 29700 and flagged.settings.origin("main_process_port") \
        == "--main_process_port"
    assert refusal_in(slurm_step_of(0, per_node=1, MASTER_PORT="29600"),
                      LaunchRequest("t.py", cpu=True, main_process_port=29700)) == (
        "--main_process_port 29700 contradicts MASTER_PORT=29600 in the environment; drop "
        "--main_process_port, or give --no_slurm to ignore SLURM")
    assert refusal_in(slurm_step_of(0, per_node=1, MASTER_PORT="http")).startswith(
        "MASTER_PORT='http' is not a TCP port from 1 to 65535")


def test_a_node_list_of_mixed_names_gives_its_first_host_as_main_address():
    environ = slurm_task(0, 0, 0, "gpu-a", SLURM_STEP_NODELIST="gpu-a,node[01,07]",
                         SLURM_STEP_NUM_NODES="3", SLURM_STEP_NUM_TASKS="3",
                         SLURM_STEP_TASKS_PER_NODE="1(x3)")
    assert plan_in(environ).settings.main_process_ip == "gpu-a"


def test_a_contradicting_machine_rank_is_refused_naming_both_sources():
    assert refusal_in(slurm_step_of(1, per_node=1), LaunchRequest("t.py", cpu=True, machine_rank=0)) == (
        "--machine_rank 0 contradicts SLURM's node rank 1 (SLURM_NODEID); drop --machine_rank, "
        "or give --no_slurm to ignore SLURM")
    assert refusal_in(slurm_step_of(0, per_node=1), profile=Profile(num_machines=4, main_process_ip="a")) == (
        "num_machines: 4 in p.yaml contradicts SLURM's 2 nodes (SLURM_STEP_NUM_NODES); drop "
        "num_machines from p.yaml, or give --no_slurm to ignore SLURM")


def test_a_step_of_one_node_is_this_machine_alone_and_a_profiles_address_does_not_matter():
    environ = slurm_task(0, 0, 0, "node01", SLURM_STEP_NODELIST="node01", SLURM_STEP_NUM_NODES="1",
                         SLURM_STEP_NUM_TASKS="1", SLURM_STEP_TASKS_PER_NODE="1")
    plan = plan_in(environ, profile=Profile(main_process_ip="10.0.0.1", main_process_port=29400))
    assert (plan.settings.num_machines, plan.engine) == (1, "single")
    assert plan.summary().endswith("; slurm job 31: node 1 of 1 (node01)")


def test_no_slurm_and_the_profile_key_ignore_the_step():
    environ = slurm_step_of(1, per_node=1)
    for plan in (plan_in(environ, LaunchRequest("t.py", cpu=True, slurm=False)),
                 plan_in(environ, profile=Profile(slurm=False))):
        assert plan.cluster is None and plan.settings.num_machines == 1 and plan.engine == "single"
    assert slurm_cluster(merge(options_layer(LaunchRequest("t.py", slurm=False))), environ) is NO_CLUSTER


def test_outside_slurm_nothing_changes():
    plan = plan_in({"PATH": "/usr/bin"})
    assert plan.cluster is None and plan.settings.kind("num_machines") == DEFAULT


# ---------------------------------------------------------------- rank mode


def test_several_tasks_per_node_each_run_one_rank_with_torchruns_variables():
    plan = plan_in(slurm_step_of(3, per_node=2))
    assert plan.rank_mode and plan.engine == "single" and plan.world_size == 4
    assert {key: plan.env[key] for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                           "GROUP_RANK", "MASTER_ADDR")} == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1", "MASTER_ADDR": "node01"}
    assert plan.env["MASTER_PORT"] == str(derived_port("31", "0"))
    assert plan.env["OMP_NUM_THREADS"] == "1"  # two tasks share the node's 2 cores
    assert plan.removed == {}  # the plan's own RANK and MASTER_* reach the script
    assert plan.cluster.line(plan.settings) == "slurm job 31: rank 3 of 4 (node02, local rank 1)"
    assert "1 process of 4, 2 on each of 2 nodes; slurm job 31: rank 3 of 4" in plan.summary()
    text = plan.describe()
    assert "rank:            3 (SLURM_PROCID), local rank 1 (SLURM_LOCALID)" in text
    assert "engine:          single" in text


def test_rank_mode_on_gpus_gives_each_task_its_local_ranks_gpu_and_pins_none():
    plan = plan_in(slurm_step_of(1, per_node=2), LaunchRequest("t.py"), machine="linux_2gpu")
    assert plan.device == "cuda" and plan.env["LOCAL_RANK"] == "1"
    assert "ACCELERATE_TORCH_DEVICE" not in plan.env  # it would put every rank on one GPU
    assert "CUDA_VISIBLE_DEVICES" not in plan.env


def test_rank_mode_with_more_tasks_than_gpus_is_refused_with_per_task_binding_named():
    refusal = refusal_in(slurm_step_of(0, per_node=2, CUDA_VISIBLE_DEVICES="0"), LaunchRequest("t.py"),
                         machine="linux_1gpu")
    assert refusal.startswith("SLURM's 2 tasks on node01 (SLURM_STEP_TASKS_PER_NODE) each need a "
                              "GPU of their own, and this task sees 1 NVIDIA GPU (CUDA_VISIBLE_DEVICES=0)")
    assert "--gpus-per-task" in refusal and "--gpus-per-node=2" in refusal


def test_rank_mode_on_mps_is_refused():
    refusal = refusal_in(slurm_step_of(0, per_node=2), LaunchRequest("t.py"), machine="m2_macos15")
    assert refusal.startswith("SLURM's 2 tasks on node01 (SLURM_STEP_TASKS_PER_NODE) cannot all "
                              "train on mps")


@pytest.mark.parametrize("request_, words", [
    (LaunchRequest("t.py", cpu=True, num_processes=2), "--num_processes 2 contradicts one process in "
     "each of SLURM's tasks, 2 on each node (SLURM_STEP_TASKS_PER_NODE); drop --num_processes, or "
     "start one task per node (srun --ntasks-per-node=1)"),
    (LaunchRequest("t.py", cpu=True, max_restarts=1), "--max_restarts 1 contradicts SLURM's 2 tasks "
     "on each node, which run the script without torch's agent (SLURM_STEP_TASKS_PER_NODE)"),
    (LaunchRequest("t.py", cpu=True, rdzv_backend="c10d"), "--rdzv_backend c10d contradicts SLURM's "
     "2 tasks on each node, which run the script without torch's agent"),
], ids=["num_processes", "max_restarts", "c10d"])
def test_rank_mode_refuses_what_only_torchs_agent_does(request_, words):
    assert refusal_in(slurm_step_of(0, per_node=2), request_).startswith(words)


def test_rank_mode_takes_one_process_per_task_and_refuses_a_profiles_count():
    assert plan_in(slurm_step_of(0, per_node=2), LaunchRequest("t.py", cpu=True, num_processes=1)).rank_mode
    assert refusal_in(slurm_step_of(0, per_node=2), profile=Profile(num_processes=4)).startswith(
        "num_processes: 4 in p.yaml contradicts one process in each of SLURM's tasks")


# ---------------------------------------------------------------- what SLURM cannot run


def batch(**extra) -> dict[str, str]:
    """A batch script's environment (sbatch -N2 --ntasks-per-node=1, no srun), as measured."""
    return {**SLURM_JOB, "ENVIRONMENT": "BATCH", "SLURM_JOB_NAME": "wrap", "SLURM_PROCID": "0",
            "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", **extra}


def test_a_job_of_several_nodes_outside_srun_is_refused_saying_to_use_srun():
    assert refusal_in(batch()) == (
        "this is the batch script of SLURM job 31, outside any srun step, and the job has 2 "
        "nodes: a launch here would train alone while the job's other nodes wait; start it on "
        "every node with srun (`srun --ntasks-per-node=1 mpslaunch launch ...`), or give "
        "--no_slurm to ignore SLURM and run here alone")
    salloc = {**SLURM_JOB, "SLURM_JOB_NAME": "interactive", "SLURM_JOB_NUM_NODES": "1",
              "SLURM_NNODES": "1", "SLURM_NTASKS": "4"}
    assert refusal_in(salloc).startswith("this is the salloc shell of SLURM job 31, outside any "
                                         "srun step, and the job has 4 tasks")
    assert plan_in(batch(), LaunchRequest("t.py", cpu=True, slurm=False)).cluster is None


def test_a_job_of_one_node_and_one_task_outside_srun_runs_as_anywhere():
    one = batch(SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1", SLURM_NTASKS="1")
    plan = plan_in(one)
    assert plan.cluster is None and plan.engine == "single"


def test_uneven_tasks_per_node_are_refused():
    environ = slurm_task(2, 1, 0, "node02", SLURM_STEP_NUM_TASKS="3", SLURM_STEP_TASKS_PER_NODE="2,1")
    assert refusal_in(environ).startswith("SLURM's step puts 2,1 tasks on its 2 nodes "
                                          "(SLURM_STEP_TASKS_PER_NODE), and mpslaunch needs as many "
                                          "on every node")


def test_a_heterogeneous_job_is_refused():
    assert refusal_in(slurm_step_of(0, per_node=1, SLURM_HET_SIZE="2")).startswith(
        "SLURM job 31 is a heterogeneous job")


def test_a_node_list_that_cannot_be_read_asks_for_the_main_address():
    environ = slurm_step_of(1, per_node=1, node_list="dgx[1-2]-ib")
    assert refusal_in(environ).startswith("cannot read SLURM's node list (the node list "
                                          "'dgx[1-2]-ib' has text after the last bracket")
    assert "give --main_process_ip with its address" in refusal_in(environ)
    plan = plan_in(environ, LaunchRequest("t.py", cpu=True, main_process_ip="10.0.0.1"))
    assert plan.settings.main_process_ip == "10.0.0.1" and plan.settings.machine_rank == 1


def test_a_step_whose_variables_contradict_each_other_is_refused_with_the_escape():
    refusal = refusal_in(slurm_step_of(0, per_node=1, SLURM_STEP_NUM_TASKS="5"))
    assert refusal.startswith("the step's variables contradict each other")
    assert refusal.endswith("; give --no_slurm to ignore SLURM")


# ---------------------------------------------------------------- the cluster's configuration


def test_a_grace_period_longer_than_killwait_is_warned_of():
    plan = plan_in(slurm_step_of(0, per_node=2))
    place, warnings = with_slurm_config(plan.cluster, 30.0, 5, "proctrack/cgroup")
    assert place.delivers_signals and warnings[0].startswith(
        "SLURM kills a cancelled job's processes 5 s after its SIGTERM (KillWait), before the 30 s "
        "of --grace_period end")
    assert with_slurm_config(plan.cluster, 30.0, 30, None)[1] == ()
    assert with_slurm_config(plan.cluster, 30.0, None, None)[1] == ()


def test_slurm_signals_every_process_itself_except_through_a_terminal_or_by_process_group():
    plan = plan_in(slurm_step_of(0, per_node=2))
    assert plan.cluster.delivers_signals
    assert not plan_in(slurm_step_of(0, per_node=2, SLURM_PTY_PORT="38605")).cluster.delivers_signals
    assert not with_slurm_config(plan.cluster, 1.0, 5, "proctrack/pgid")[0].delivers_signals


def test_the_cluster_layers_are_facts_and_a_derived_port():
    cluster = slurm_cluster(merge(), slurm_step_of(0, per_node=1))
    assert cluster.facts.kind == CLUSTER and cluster.facts.where == "SLURM"
    assert cluster.derived.kind == DEFAULT and set(cluster.derived.values) == {"main_process_port"}
