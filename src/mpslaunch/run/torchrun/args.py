"""From a LaunchPlan to torch.distributed.run's arguments and each rank's environment. Pure.

No torch import and no side effect, so --dry_run is fast and tests check the arguments for any
number of machines. One machine always uses a static rendezvous on 127.0.0.1.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

from mpslaunch.machine import endpoint, loopback_interface
from mpslaunch.plan import LaunchPlan
from mpslaunch.settings import DEFAULT_PORT

LOOPBACK = "127.0.0.1"
SHARED_RUN_ID = "mpslaunch"  # several machines must agree on it; one machine gets a unique one
# Each console line of a rank starts with its global rank, like torchrun --tee with a prefix.
# Through the environment: torch 2.11's torchrun has no --log-line-prefix-template option.
LINE_PREFIX = "[rank${rank}] "
LINE_PREFIX_VARIABLE = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
MONITOR_INTERVAL = "0.1"  # seconds between checks of the ranks (older torch defaulted to 5)
FREE_PORT = "<free port>"  # what --dry_run shows before the port is picked


@dataclass(frozen=True)
class Rendezvous:
    """Where the machines meet: torchrun's --rdzv-* / --master-* settings."""

    backend: str  # "static" or "c10d"
    address: str
    port: int  # 0: a free port on 127.0.0.1, picked when the run starts (one machine only)
    node_rank: int | None  # None: assigned at the rendezvous (c10d)
    run_id: str
    local: bool  # one machine: everything binds to 127.0.0.1


def rendezvous_for(plan: LaunchPlan, run_id: str) -> Rendezvous:
    settings = plan.settings
    if settings.num_machines == 1:
        return Rendezvous("static", LOOPBACK, settings.main_process_port, 0, run_id, local=True)
    # Port 0 cannot mean "a free one" across machines: the others could not know it.
    port = settings.main_process_port or DEFAULT_PORT
    # c10d assigns the machines' ranks at the rendezvous.
    node_rank = settings.machine_rank if settings.rdzv_backend == "static" else None
    return Rendezvous(
        settings.rdzv_backend, settings.main_process_ip, port, node_rank, SHARED_RUN_ID, local=False
    )


def arguments(
    plan: LaunchPlan,
    rendezvous: Rendezvous,
    port_text: str | None = None,
    log_dir: str | None = None,
) -> list[str]:
    """torch.distributed.run's command line (without `python -m torch.distributed.run`)."""
    port = port_text or str(rendezvous.port)
    args = [
        "--nnodes",
        str(plan.settings.num_machines),
        "--nproc-per-node",
        str(plan.settings.num_processes),
        "--rdzv-backend",
        rendezvous.backend,
        "--rdzv-id",
        rendezvous.run_id,
        "--max-restarts",
        str(plan.settings.max_restarts),
        "--monitor-interval",
        f"{plan.monitor_interval:g}" if plan.monitor_interval else MONITOR_INTERVAL,
    ]
    if rendezvous.backend == "static":
        # torch parses the address with the port: a bare IPv6 address needs its brackets.
        host = endpoint(rendezvous.address, port).rpartition(":")[0]
        args += [
            "--node-rank",
            str(rendezvous.node_rank),
            "--master-addr",
            host,
            "--master-port",
            port,
        ]
    else:
        args += ["--rdzv-endpoint", endpoint(rendezvous.address, port)]
    if not rendezvous.local:  # each backend names its join timeout differently
        key = "timeout" if rendezvous.backend == "static" else "join_timeout"
        args += ["--rdzv-conf", f"{key}={plan.settings.rdzv_timeout}"]
    # --tee 3: both streams of every rank go to its log files and, prefixed, to the console.
    args += ["--tee", "3"]
    if log_dir:
        args += ["--log-dir", log_dir]
    if plan.no_python:
        return args + ["--no-python", *plan.command]
    return args + target_arguments(plan.command)


def target_arguments(command: tuple[str, ...]) -> list[str]:
    """plan.command is (python, script, args...) or (python, -m, module, args...)."""
    rest = list(command[1:])
    if rest[:1] == ["-m"]:
        return ["--module", *rest[1:]]
    return rest


# ---------------------------------------------------------------- environment


def launcher_environment(
    plan: LaunchPlan,
    rendezvous: Rendezvous,
    environ: Mapping[str, str],
    platform: str = sys.platform,
) -> dict[str, str]:
    """What every rank gets on top of the user's environment: plan.env and what this path adds."""
    env = dict(plan.env)
    if rendezvous.local:
        # gloo and nccl open listening sockets of their own: keep them on the loopback too.
        names = ["GLOO_SOCKET_IFNAME"] + (["NCCL_SOCKET_IFNAME"] if plan.device == "cuda" else [])
        for name in names:
            if name not in environ:
                env[name] = loopback_interface(platform)
    return env


def rank_environments(
    plan: LaunchPlan, rendezvous: Rendezvous, port_text: str | None = None
) -> list[dict[str, str]]:
    """The variables torchrun gives each local rank on this machine (for --dry_run)."""
    world = plan.world_size
    static = rendezvous.backend == "static"
    table = []
    processes = plan.settings.num_processes
    for local_rank in range(processes):
        if rendezvous.node_rank is None:
            rank = group_rank = "<assigned at rendezvous>"
        else:
            rank = str(rendezvous.node_rank * processes + local_rank)
            group_rank = str(rendezvous.node_rank)
        table.append(
            {
                "RANK": rank,
                "LOCAL_RANK": str(local_rank),
                "GROUP_RANK": group_rank,
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(processes),
                # c10d: the store that the ranks share is on whichever machine got rank 0.
                "MASTER_ADDR": rendezvous.address if static else "<set at rendezvous>",
                "MASTER_PORT": (port_text or str(rendezvous.port))
                if static
                else "<set at rendezvous>",
            }
        )
    return table
