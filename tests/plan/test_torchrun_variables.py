"""torchrun's PET_ variables (what Kubeflow's PyTorchJob sets in each pod) as a cluster layer
(plan/torchrun_variables.py): facts a flag may not contradict, each named by its variable."""

from __future__ import annotations

import pytest

from helpers import MACHINES, one_line_error, refusal_of, run_cli, write_script
from mpslaunch.plan import decide_settings, settle, torchrun_layer
from mpslaunch.settings import CLUSTER, LaunchOptions, options_layer

POD = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "trainer-master-0",
       "PET_MASTER_PORT": "23456", "PET_NPROC_PER_NODE": "2"}


def test_a_pods_variables_give_the_machines_rank_address_and_processes():
    settings = settle(options_layer(LaunchOptions(cpu=True)), torchrun_layer(POD))
    assert (settings.num_machines, settings.machine_rank, settings.main_process_ip,
            settings.main_process_port, settings.num_processes) == (2, 1, "trainer-master-0", 23456, 2)
    assert settings.kind("machine_rank") == CLUSTER and settings.origin("machine_rank") == "PET_NODE_RANK"
    assert settings.named("num_machines") == "PET_NNODES=2"
    plan = decide_settings(settings, LaunchOptions(cpu=True), MACHINES["linux_cpu"], {})
    assert plan.engine == "torchrun" and plan.world_size == 4


def test_torchruns_own_counts_leave_the_processes_to_mpslaunch_and_a_fixed_range_is_a_count():
    layer = torchrun_layer({**POD, "PET_NPROC_PER_NODE": "gpu", "PET_NNODES": "3:3"})
    assert "num_processes" not in layer.values and layer.values["num_machines"] == 3


@pytest.mark.parametrize("change, refusal", [
    ({"PET_NNODES": "1:4"}, "PET_NNODES=1:4 asks for between 1 and 4 machines, an elastic run "
                            "that mpslaunch does not start"),
    ({"PET_NODE_RANK": "first"}, "PET_NODE_RANK='first' cannot be read as --machine_rank: it must "
                                 "be int, not str 'first'"),
    ({"PET_MASTER_PORT": "70000"}, "PET_MASTER_PORT='70000' cannot be read as --main_process_port"),
    ({"PET_NNODES": "0"}, "PET_NNODES='0' cannot be read as --num_machines: it must be 1 or more"),
])
def test_a_variable_that_cannot_be_read_is_refused_with_the_way_out(change, refusal):
    message = refusal_of(lambda: torchrun_layer({**POD, **change}))
    assert message.startswith(refusal) and message.endswith("unset the PET_ variables to ignore them")


@pytest.mark.slow
def test_a_flag_that_contradicts_a_pods_variable_is_refused_in_one_line(tmp_path):
    script = write_script(tmp_path, "train.py", "print('trained')\n")
    line = one_line_error(run_cli("launch", "--cpu", "--machine_rank", "0", str(script), env=POD))
    assert line == ("mpslaunch: error: --machine_rank 0 contradicts PET_NODE_RANK=1; drop "
                    "--machine_rank, or unset the PET_ variables to ignore them")


def test_without_pet_variables_the_layer_is_empty():
    assert torchrun_layer({"PATH": "/usr/bin"}).values == {}
