"""torchrun_args: the torch.distributed.run command line and the ranks' environment, from a plan."""

from __future__ import annotations

import pytest

from helpers import MACHINES
from mpslaunch.plan import resolve
from mpslaunch.settings import LaunchRequest
from mpslaunch.settings import Profile
from mpslaunch.run.torchrun.args import (DEFAULT_PORT, FREE_PORT, SHARED_RUN_ID, arguments,
                                     launcher_environment, rank_environments, rendezvous_for,
                                     target_arguments)


def plan_for(machine: str = "linux_8gpu", profile: Profile | None = None, environ=None, **flags):
    request = LaunchRequest(flags.pop("target", "train.py"), flags.pop("target_args", ("--lr", "0.1")),
                            **flags)
    return resolve(profile or Profile(), request, MACHINES[machine], environ or {})


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def assert_options(args: list[str], expected: dict[str, str]) -> None:
    assert {name: option(args, name) for name in expected} == expected


def test_one_machine_is_a_static_rendezvous_on_the_loopback():
    plan = plan_for(num_processes=4, rdzv_backend="c10d")  # c10d means nothing on one machine
    rendezvous = rendezvous_for(plan, "run-1")
    assert (rendezvous.backend, rendezvous.address, rendezvous.local) == ("static", "127.0.0.1", True)
    args = arguments(plan, rendezvous, "41234", "/logs")
    assert_options(args, {"--nnodes": "1", "--nproc-per-node": "4", "--rdzv-backend": "static",
                          "--master-addr": "127.0.0.1", "--master-port": "41234", "--node-rank": "0",
                          "--rdzv-id": "run-1", "--log-dir": "/logs", "--tee": "3"})
    assert "--rdzv-endpoint" not in args


def test_port_zero_on_one_machine_stays_zero_until_the_run_picks_one():
    rendezvous = rendezvous_for(plan_for(num_processes=2), "run")
    assert rendezvous.port == 0
    assert option(arguments(plan_for(num_processes=2), rendezvous, FREE_PORT), "--master-port") == FREE_PORT


def test_a_fixed_port_on_one_machine_is_kept():
    plan = plan_for(num_processes=2, main_process_port=29555)
    assert option(arguments(plan, rendezvous_for(plan, "run")), "--master-port") == "29555"


def test_several_machines_static():
    plan = plan_for(num_processes=8, num_machines=3, machine_rank=2, main_process_ip="10.1.2.3",
                    main_process_port=29600)
    rendezvous = rendezvous_for(plan, "ignored-for-several-machines")
    args = arguments(plan, rendezvous)
    assert not rendezvous.local
    assert_options(args, {"--nnodes": "3", "--nproc-per-node": "8", "--rdzv-backend": "static",
                          "--node-rank": "2", "--master-addr": "10.1.2.3", "--master-port": "29600",
                          "--max-restarts": "0"})  # restarts need c10d (test_machines.py)
    # Every machine computes the same id, or their agents would not see each other in the store.
    assert option(args, "--rdzv-id") == SHARED_RUN_ID


def test_several_machines_c10d_uses_an_endpoint_and_no_node_rank():
    plan = plan_for(num_processes=2, num_machines=2, machine_rank=1, main_process_ip="10.1.2.3",
                    main_process_port=29601, rdzv_backend="c10d")
    args = arguments(plan, rendezvous_for(plan, "x"))
    assert option(args, "--rdzv-backend") == "c10d"
    assert option(args, "--rdzv-endpoint") == "10.1.2.3:29601"
    assert "--node-rank" not in args and "--master-addr" not in args


def test_port_zero_on_several_machines_becomes_torchruns_default():
    plan = plan_for(num_processes=2, num_machines=2, main_process_ip="10.1.2.3", rdzv_backend="c10d")
    assert option(arguments(plan, rendezvous_for(plan, "x")), "--rdzv-endpoint") == f"10.1.2.3:{DEFAULT_PORT}"


def test_ipv6_address_gets_brackets():
    plan = plan_for(num_processes=2, num_machines=2, main_process_ip="fd00::5")
    assert option(arguments(plan, rendezvous_for(plan, "x")), "--master-addr") == "[fd00::5]"


def test_arguments_parse_with_torchs_own_parser():
    run = pytest.importorskip("torch.distributed.run")
    plan = plan_for(num_processes=2, num_machines=2, machine_rank=1, main_process_ip="10.1.2.3",
                    target_args=("--epochs", "2", "--nnodes", "9"))
    parsed = run.parse_args(arguments(plan, rendezvous_for(plan, "x"), log_dir="/tmp/l"))
    assert (parsed.nnodes, parsed.nproc_per_node, parsed.node_rank) == ("2", "2", 1)
    assert (parsed.master_addr, parsed.master_port, parsed.max_restarts) == ("10.1.2.3", DEFAULT_PORT, 0)
    assert parsed.training_script == "train.py"
    assert parsed.training_script_args == ["--epochs", "2", "--nnodes", "9"]  # the script's own
    assert parsed.log_dir == "/tmp/l" and parsed.tee == "3"


# The options of torch 2.11's torch.distributed.run (its usage text, read on the GPU machine):
# the oldest torch this path is run with; it has no --log-line-prefix-template, for one.
TORCH_2_11_OPTIONS = {
    "--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
    "--standalone", "--max-restarts", "--monitor-interval", "--start-method", "--event-log-handler",
    "--role", "--module", "--no-python", "--run-path", "--log-dir", "--redirects", "--tee",
    "--local-ranks-filter", "--duplicate-stdout-filters", "--duplicate-stderr-filters",
    "--node-rank", "--master-addr", "--master-port", "--local-addr", "--logs-specs",
    "--numa-binding", "--signals-to-handle", "--virtual-local-rank",
}


@pytest.mark.parametrize("flags", [
    {"num_processes": 2},
    {"num_processes": 2, "num_machines": 2, "main_process_ip": "10.1.2.3"},
    {"num_processes": 2, "num_machines": 2, "main_process_ip": "10.1.2.3", "rdzv_backend": "c10d",
     "max_restarts": 1},
    {"num_processes": 2, "module": True, "target": "pkg.train"},
])
def test_only_options_that_torch_2_11_knows(flags):
    plan = plan_for(**flags, target_args=("--not-ours", "1"))
    args = arguments(plan, rendezvous_for(plan, "r"), log_dir="/logs")
    ours = args[:len(args) - len(target_arguments(plan.command))]
    assert {word for word in ours if word.startswith("--")} <= TORCH_2_11_OPTIONS


def test_module_target_becomes_torchruns_module_flag():
    plan = plan_for(num_processes=2, target="pkg.train", module=True, target_args=("-m", "x"))
    assert target_arguments(plan.command) == ["--module", "pkg.train", "-m", "x"]
    assert arguments(plan, rendezvous_for(plan, "r"))[-4:] == ["--module", "pkg.train", "-m", "x"]


# ---------------------------------------------------------------- environment


def test_plan_environment_and_loopback_interfaces_reach_every_rank():
    plan = plan_for("linux_cpu", cpu=True, num_processes=2)
    env = launcher_environment(plan, rendezvous_for(plan, "r"), {}, platform="linux")
    assert env["ACCELERATE_USE_CPU"] == "true"
    assert env["MPSLAUNCH_DEVICE"] == "cpu"
    assert env["OMP_NUM_THREADS"] == "1"  # 2 cores / 2 processes (plan's rule)
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert "NCCL_SOCKET_IFNAME" not in env


def test_cuda_gets_torchruns_omp_default_and_nccl_on_the_loopback():
    plan = plan_for("linux_8gpu", num_processes=8)
    env = launcher_environment(plan, rendezvous_for(plan, "r"), {}, platform="darwin")
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "lo0"
    assert "ACCELERATE_TORCH_DEVICE" not in env  # it would put every rank on one GPU


def test_users_own_settings_are_kept():
    environ = {"OMP_NUM_THREADS": "6", "NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1"}
    plan = plan_for("linux_8gpu", None, environ, num_processes=2)
    env = launcher_environment(plan, rendezvous_for(plan, "r"), environ)
    assert not {"OMP_NUM_THREADS", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} & set(env)


def test_one_process_a_machine_keeps_the_default_threads():
    plan = plan_for(num_processes=1, num_machines=2, main_process_ip="10.1.2.3")
    assert "OMP_NUM_THREADS" not in launcher_environment(plan, rendezvous_for(plan, "r"), {})


def test_several_machines_leave_the_network_interfaces_alone():
    plan = plan_for(num_processes=2, num_machines=2, main_process_ip="10.1.2.3")
    env = launcher_environment(plan, rendezvous_for(plan, "r"), {})
    assert "NCCL_SOCKET_IFNAME" not in env and "GLOO_SOCKET_IFNAME" not in env


def test_rank_environments_static():
    plan = plan_for(num_processes=2, num_machines=2, machine_rank=1, main_process_ip="10.1.2.3")
    table = rank_environments(plan, rendezvous_for(plan, "r"))
    assert [row["RANK"] for row in table] == ["2", "3"]
    assert [row["LOCAL_RANK"] for row in table] == ["0", "1"]
    assert {row["WORLD_SIZE"] for row in table} == {"4"}
    assert {(row["MASTER_ADDR"], row["MASTER_PORT"]) for row in table} == {("10.1.2.3", str(DEFAULT_PORT))}


def test_rank_environments_c10d_ranks_are_assigned_at_rendezvous():
    plan = plan_for(num_processes=2, num_machines=2, main_process_ip="10.1.2.3", rdzv_backend="c10d")
    row = rank_environments(plan, rendezvous_for(plan, "r"))[0]
    assert "rendezvous" in row["RANK"] and "rendezvous" in row["MASTER_ADDR"]
