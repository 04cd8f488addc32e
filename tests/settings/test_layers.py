"""The settings' layers (settings/layers.py, plan.settle): a later layer wins over an earlier
one, the defaults fill the rest, and every value knows where it came from; a cluster's values
are facts, proven here with a made-up cluster layer of the shape a scheduler's reader gives."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from helpers import MACHINES
from mpslaunch.output import MpslaunchError
from mpslaunch.plan import decide_settings, for_target, settle
from mpslaunch.settings import (ACCELERATE, API, CLUSTER, COMMAND_LINE, DEFAULT, PROFILE,
                                LaunchOptions, LaunchRequest, Layer, Profile, Settings,
                                file_layer, merge, options_layer, profile_files, profile_layer)

# What a scheduler's reader gives: its values, each with its own words and variable.
JOB_WORDS = {
    "num_machines": ("the job's {value} nodes (JOB_NNODES)", "JOB_NNODES"),
    "machine_rank": ("the job's node rank {value} (JOB_NODEID)", "JOB_NODEID"),
    "main_process_ip": ("the job's first node {value} (JOB_NODELIST)", "JOB_NODELIST"),
    "main_process_port": ("the job's port {value} (JOB_PORT)", "JOB_PORT"),
}


def job(**values) -> Layer:
    return Layer(CLUSTER, values, "JOB", {key: JOB_WORDS[key] for key in values},
                 escape="give --no_job to ignore JOB")


def profile_file(tmp_path, text: str) -> Layer:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return file_layer(profile_files.read(path))


# ---------------------------------------------------------------- precedence and origins


def test_each_value_comes_from_the_last_layer_that_sets_it_and_says_which(tmp_path):
    settings = merge(profile_file(tmp_path, "device: cpu\nnum_processes: 4\nmixed_precision: bf16\n"),
                     options_layer(LaunchOptions(num_processes=2)))
    path = tmp_path / "p.yaml"
    assert (settings.device, settings.num_processes, settings.mixed_precision,
            settings.num_machines) == ("cpu", 2, "bf16", 1)
    assert [settings.kind(key) for key in ("num_processes", "mixed_precision", "num_machines")] \
        == [COMMAND_LINE, PROFILE, DEFAULT]
    assert settings.origin("num_processes") == "--num_processes"
    assert settings.origin("mixed_precision") == f"profile {path}"
    assert settings.origin("num_machines") == "default"
    assert settings.named("num_processes") == "--num_processes 2"
    assert settings.named("mixed_precision") == f"mixed_precision: bf16 in {path}"
    assert settings.named("num_machines") == "num_machines 1 (default)"


def test_a_profile_file_gives_only_its_own_keys_even_those_at_their_default(tmp_path):
    settings = merge(profile_file(tmp_path, "num_machines: 1\n"))
    assert settings.kind("num_machines") == PROFILE and settings.kind("device") == DEFAULT


def test_an_accelerate_config_is_named_as_one_with_its_path(tmp_path):
    path = tmp_path / "acc.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
                    "num_processes: 2\nmixed_precision: bf16\nuse_cpu: true\n")
    settings = merge(file_layer(profile_files.read(path)))
    assert settings.kind("num_processes") == ACCELERATE and settings.num_processes == 2
    assert settings.origin("mixed_precision") == f"Accelerate config {path}"
    assert settings.named("device") == f"device: cpu from the Accelerate config {path}"
    assert settings.kind("max_restarts") == DEFAULT  # the file does not speak of it


def test_the_api_names_its_keywords_and_the_command_line_its_flags():
    api = merge(options_layer(LaunchOptions(cpu=True, mixed_precision="bf16"), API))
    assert (api.named("device"), api.named("mixed_precision")) == ("cpu=True", "mixed_precision='bf16'")
    assert api.origin("device") == "mpslaunch.launch()"
    flags = merge(options_layer(LaunchOptions(cpu=True, check=False, keep_awake=False)))
    assert (flags.named("device"), flags.named("check"), flags.named("keep_awake")) == \
        ("--cpu", "--no_check", "--no_keep_awake")
    with pytest.raises(MpslaunchError, match=r"^--cpu and --device mps contradict each other"):
        options_layer(LaunchOptions(cpu=True, device="mps"))


def test_a_profile_made_in_python_gives_what_differs_from_the_defaults():
    settings = merge(profile_layer(Profile(num_processes=3, num_machines=1)))
    assert settings.kind("num_processes") == PROFILE and settings.kind("num_machines") == DEFAULT
    assert settings.named("num_processes") == "num_processes: 3 in the profile"


def test_a_value_a_rule_derives_keeps_where_it_came_from():
    settings = settle(options_layer(LaunchOptions(num_machines=2, main_process_ip="[::1]")))
    assert settings.main_process_ip == "::1" and settings.origin("main_process_ip") == \
        "--main_process_ip"
    plan = decide_settings(settle(), LaunchOptions(), MACHINES["linux_2gpu"], {})
    assert plan.settings.num_processes == 2 and plan.settings.kind("num_processes") == DEFAULT


def test_a_refusal_between_keys_names_each_value_where_it_came_from(tmp_path):
    with pytest.raises(MpslaunchError) as refused:
        settle(profile_file(tmp_path, "num_machines: 2\nmain_process_ip: 10.0.0.1\n"),
               options_layer(LaunchOptions(machine_rank=2)))
    assert str(refused.value) == (f"--machine_rank 2 must be below num_machines: 2 in "
                                  f"{tmp_path / 'p.yaml'}, since ranks count from 0")


KEYS = ("num_processes", "num_machines", "machine_rank", "max_restarts")
values = st.dictionaries(st.sampled_from(KEYS), st.integers(0, 3), max_size=len(KEYS))


@given(st.lists(st.tuples(st.sampled_from([PROFILE, COMMAND_LINE, API]), values), max_size=4))
def test_the_last_user_layer_that_sets_a_key_wins(layers):
    settings = merge(*(Layer(kind, given) for kind, given in layers))
    for key in KEYS:
        setters = [(kind, given[key]) for kind, given in layers if key in given]
        expected = setters[-1] if setters else (DEFAULT, getattr(Profile(), key))
        assert (settings.kind(key), getattr(settings, key)) == expected


# ---------------------------------------------------------------- a cluster's facts


def test_a_cluster_fills_what_the_user_did_not_set():
    settings = merge(options_layer(LaunchOptions(num_processes=2)),
                     job(num_machines=2, machine_rank=1, main_process_ip="node01"))
    assert (settings.num_machines, settings.machine_rank, settings.main_process_ip) == \
        (2, 1, "node01")
    assert settings.kind("machine_rank") == CLUSTER and settings.origin("machine_rank") == "JOB_NODEID"
    assert settings.named("machine_rank") == "the job's node rank 1 (JOB_NODEID)"
    assert settings.kind("num_processes") == COMMAND_LINE


@pytest.mark.parametrize("cluster_first", [False, True])
def test_a_user_value_that_agrees_with_the_cluster_is_taken_and_the_fact_named(cluster_first):
    layers = [options_layer(LaunchOptions(machine_rank=1)), job(machine_rank=1)]
    settings = merge(*(reversed(layers) if cluster_first else layers))
    assert settings.machine_rank == 1 and settings.origin("machine_rank") == "JOB_NODEID"


@pytest.mark.parametrize("cluster_first", [False, True])
def test_a_flag_that_contradicts_the_cluster_is_refused_naming_both(cluster_first):
    layers = [options_layer(LaunchOptions(machine_rank=0)), job(machine_rank=1)]
    with pytest.raises(MpslaunchError) as refused:
        merge(*(reversed(layers) if cluster_first else layers))
    assert str(refused.value) == ("--machine_rank 0 contradicts the job's node rank 1 (JOB_NODEID); "
                                  "drop --machine_rank, or give --no_job to ignore JOB")


def test_a_profile_or_api_value_that_contradicts_the_cluster_is_refused_naming_its_origin(tmp_path):
    with pytest.raises(MpslaunchError) as refused:
        merge(profile_file(tmp_path, "num_machines: 3\nmain_process_ip: a\n"), job(num_machines=2))
    assert str(refused.value) == (f"num_machines: 3 in {tmp_path / 'p.yaml'} contradicts the job's 2 "
                                  f"nodes (JOB_NNODES); drop num_machines from {tmp_path / 'p.yaml'}, "
                                  "or give --no_job to ignore JOB")
    with pytest.raises(MpslaunchError, match=r"^main_process_ip='b' contradicts the job's first "
                                             r"node a \(JOB_NODELIST\); drop main_process_ip=, or "):
        merge(options_layer(LaunchOptions(main_process_ip="b"), API), job(main_process_ip="a"))


def test_a_default_never_contradicts_a_cluster():
    assert merge(job(num_machines=4, machine_rank=3)).num_machines == 4  # defaults: 1 machine, rank 0


def test_a_plan_on_a_cluster_says_where_each_value_came_from(tmp_path):
    request = LaunchRequest("train.py", cpu=True, num_processes=2)
    settings = settle(profile_file(tmp_path, "mixed_precision: bf16\n"), options_layer(request),
                      job(num_machines=2, machine_rank=1, main_process_ip="node01",
                          main_process_port=6000))
    machine = MACHINES["linux_cpu"]
    plan = for_target(decide_settings(settings, request, machine, {}), request, machine)
    text = plan.describe()
    assert f"mixed precision: bf16 (profile {tmp_path / 'p.yaml'})" in text
    assert "processes:       2 per machine (--num_processes), 2 machines (JOB_NNODES)" in text
    assert "machine rank:    1 (JOB_NODEID)" in text
    assert "main address:    node01 (JOB_NODELIST), port 6000 (JOB_PORT)" in text
    assert "rendezvous:      static (default)" in text
    assert plan.world_size == 4 and isinstance(plan.settings, Settings)


def test_a_rule_about_a_cluster_value_names_the_cluster():
    with pytest.raises(MpslaunchError) as refused:
        settle(options_layer(LaunchOptions(max_restarts=1)),
               job(num_machines=2, machine_rank=0, main_process_ip="node01"))
    assert str(refused.value).startswith("--max_restarts 1 on several machines needs")
    with pytest.raises(MpslaunchError, match=r"^the job's 2 nodes \(JOB_NNODES\) is above 1, so "
                                             r"main_process_ip"):
        settle(job(num_machines=2, machine_rank=1))
