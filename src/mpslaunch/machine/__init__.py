"""What this computer is: its platform facts (facts.py), torch's own verdict on mps, asked in a
child Python and kept per Python, torch and macOS build (torch_check.py), and its place on the
network (network.py), the memory its control group leaves a run (limits.py); on a Mac, what keeps it
awake and its power source (power.py); the SLURM job and step it runs in, read from the
environment (slurm.py). Probed with the standard library only: the launcher never imports torch.
Tests describe other computers as `Machine` values. torch's verdict, the power source and the
SLURM reader are imported on first use (and the network and memory-limit readers); a launch
outside SLURM only asks `slurm_seen`.
"""

from mpslaunch import lazy_names
from mpslaunch.machine.facts import (
    Machine,
    available_memory,
    cpu_brand,
    memory_pressure_level,
    memory_stall_microseconds,
    mps_cache_key,
    peak_resident_bytes,
    probe,
    verify_mps,
    version_tuple,
    with_torch_facts,
)

# Imported on first use: a one-machine launch needs no address, and the memory limit is read
# while the run lasts.
__getattr__ = lazy_names(
    __name__,
    {
        "limits": ("memory_limit_left",),
        "network": (
            "address_and_port",
            "endpoint",
            "is_loopback",
            "loopback_interface",
            "plain_address",
            "with_addresses",
            "with_own_name",
        ),
        "torch_check": ("CHECK_TIMEOUT_SECONDS", "MpsAnswer", "is_torchs_own", "run_torch_check"),
        "power": ("CAFFEINATE",),
        "slurm": (
            "MAX_NODES",
            "SlurmAllocation",
            "SlurmConfig",
            "SlurmStep",
            "SlurmVariableError",
            "config_from_text",
            "expand_hostlist",
            "expand_tasks_per_node",
            "in_slurm_step",
            "kill_wait_from_config",
            "kill_wait_seconds",
            "slurm_allocation",
            "slurm_config",
            "slurm_step",
        ),
    },
)


def slurm_seen(environ) -> bool:
    """SLURM set some of its variables here (every job and step it starts has SLURM_JOB_ID):
    only then is there a step or a job for slurm.py to read."""
    return any(name.startswith("SLURM_") for name in environ)
