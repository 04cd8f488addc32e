"""Another launcher's variables, which a one-process plan keeps from the child, and what a script
finds in its environment under a plan: the launcher's own variables, as check/ reads them.
Pure, and light: it imports nothing of mpslaunch, so the check can ask it cheaply.
"""

from __future__ import annotations

from mpslaunch import Record, record

# What torchrun (and the MPI launchers, whose world sizes Accelerate also reads) give the
# processes they start. Left in a shell (a torchrun or SLURM job's), they tell a one-process
# script it is one rank of a bigger world, and its init_process_group waits for the others
# forever. A plan for one process is mpslaunch's: the child does not get them, and the summary
# and --dry_run name them. (Several processes get torchrun's own values from torch's agent.)
OTHER_LAUNCHERS_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PMI_SIZE",
    "PMI_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MV2_COMM_WORLD_SIZE",
    "MV2_COMM_WORLD_RANK",
)
REMOVED_WHY = "another launcher's; this plan is one process"


def is_other_launchers_variable(key: str) -> bool:
    return key in OTHER_LAUNCHERS_VARIABLES or key.startswith("TORCHELASTIC_")


# What torch.distributed.run gives each process it starts (its local elastic agent), and what
# those values can be with world_size processes in all.
_TORCHRUN_RANKS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK")
_TORCHRUN_SIZES = ("WORLD_SIZE", "ROLE_WORLD_SIZE")
_TORCHRUN_OTHERS = (
    "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
)


@record
class Seen(Record):
    """What a script finds in one environment variable under a plan: absent, or present with
    one of `values` (None: a value the plan does not tell, such as a port)."""

    present: bool
    values: tuple[str, ...] | None = None


def seen_by_the_script(name: str, device: str, world_size: int) -> Seen | None:
    """The launcher's own variables as the script sees them on a plan of `world_size` processes
    on `device`; None for a variable the plan does not decide (the user's own environment)."""
    if name == "MPSLAUNCH_DEVICE":
        return Seen(True, (device,))
    if name == "MPSLAUNCH_NUM_PROCESSES":
        return Seen(True, (str(world_size),))
    if world_size == 1:  # mpslaunch's own child: another launcher's variables are removed
        return Seen(False) if is_other_launchers_variable(name) else None
    if name in _TORCHRUN_RANKS:  # a superset where a machine holds fewer ranks: never wrong
        return Seen(True, tuple(str(rank) for rank in range(world_size)))
    if name in _TORCHRUN_SIZES:
        return Seen(True, (str(world_size),))
    return Seen(True) if name in _TORCHRUN_OTHERS else None
