"""SLURM in the plan: the settings an srun step gives, where this launcher stands in the step,
and what SLURM cannot run. Pure: machine/slurm.py reads the environment.

The step gives a layer of facts (settings/layers.py: a value the user gave that contradicts one
is refused, naming both), and under the user's layers the port derived from the job, which the
user may change. SLURM starts mpslaunch in one of two ways:

- node mode, one task per node (`srun --ntasks-per-node=1`): each task is one machine of the
  run and starts the node's processes through torch.distributed.run, as on any machine;
- rank mode, k > 1 tasks on every node (`srun --ntasks-per-node=8`, one task per GPU): SLURM
  started the processes, so each task runs the script as its one child with torchrun's
  variables (RANK, LOCAL_RANK, ...) taken from the step, and no torch agent runs. In the
  settings each task is a machine of one process, so the world is the step's tasks.

Only inside an srun step: a batch script or an salloc shell of several nodes or tasks is
refused, since one launcher there would train alone while the job's other nodes wait.
"""

from __future__ import annotations

from collections.abc import Mapping

from mpslaunch import Record, record
from mpslaunch.machine import Machine, slurm_seen
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import CLUSTER, DEFAULT, DEFAULT_PORT, Layer, Settings

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at every launch
if TYPE_CHECKING:
    from mpslaunch.machine import SlurmAllocation, SlurmStep

SLURM = "SLURM"
IGNORE = "give --no_slurm to ignore SLURM"
ONE_TASK_PER_NODE = "srun --ntasks-per-node=1 mpslaunch launch ..."
# Without MASTER_PORT, machine 0's port comes from the job and step ids: the same on every task,
# different for most jobs sharing a first node, and below Linux's ephemeral ports (32768 up).
DERIVED_PORT_FIRST, DERIVED_PORT_COUNT = 20000, 10000


# Where this launcher stands in the SLURM step, as the plan line and --dry_run say it:
#   job_id, node_rank (SLURM_NODEID), num_nodes, node (this task's node)
#   rank             rank mode: this task's rank in the world (SLURM_PROCID); None: node mode
#   world            rank mode: the step's tasks
#   local_rank       SLURM_LOCALID
#   local_world      tasks on each node
#   delivers_signals SLURM signals every process of the step itself (scancel, a time limit,
#                    srun's Ctrl-C), so the launcher does not forward what it gets; through srun
#                    --pty a terminal's own signals reach the launcher alone, and with
#                    proctrack/pgid SLURM reaches only its process group
@record
class Place(Record):
    job_id: str
    node_rank: int
    num_nodes: int
    node: str
    rank: int | None
    world: int
    local_rank: int
    local_world: int
    delivers_signals: bool = True

    @property
    def rank_mode(self) -> bool:
        return self.rank is not None

    def line(self, settings: Settings) -> str:
        """`slurm job 123: node 2 of 2 (node02), main node01:PORT`, or in rank mode `slurm job
        123: rank 3 of 4 (node02, local rank 1)`."""
        if self.rank_mode:
            return (
                f"slurm job {self.job_id}: rank {self.rank} of {self.world} ({self.node}, "
                f"local rank {self.local_rank})"
            )
        line = (
            f"slurm job {self.job_id}: node {self.node_rank + 1} of {self.num_nodes} ({self.node})"
        )
        if settings.num_machines > 1 and settings.main_process_ip:
            from mpslaunch.machine import endpoint  # several machines only

            port = settings.main_process_port or DEFAULT_PORT
            line += f", main {endpoint(settings.main_process_ip, port)}"
        return line


# What a cluster adds to the settings: `derived` goes under the user's layers (a default the user
# may change), `facts` over them; `place` is None outside a cluster.
@record
class Cluster(Record):
    place: Place | None
    derived: Layer
    facts: Layer


NO_CLUSTER = Cluster(None, Layer(DEFAULT, {}), Layer(CLUSTER, {}, SLURM))


def slurm_cluster(user: Settings, environ: Mapping[str, str]) -> Cluster:
    """The cluster of the srun step this launcher runs in, given what the user's layers say
    (`slurm: false` or --no_slurm ignores SLURM; a main address given where SLURM's node list
    cannot be read). NO_CLUSTER outside a step; MpslaunchError for what SLURM cannot run."""
    if not user.slurm or not slurm_seen(environ):
        return NO_CLUSTER
    from mpslaunch.machine import SlurmVariableError, slurm_allocation, slurm_step

    try:
        step = slurm_step(environ)
    except SlurmVariableError as error:
        raise MpslaunchError(f"{error}; {IGNORE}") from None
    if step is None:
        _check_allocation(slurm_allocation(environ))
        return NO_CLUSTER
    tasks = _check_step(step, user)
    port = _port(step, environ)
    if tasks > 1:
        return _rank_mode(step, tasks, port)
    return _node_mode(step, port)


def _node_mode(step: SlurmStep, port: Layer) -> Cluster:
    nodes = step.num_nodes
    place = Place(
        step.job_id,
        step.node_rank,
        nodes,
        step.this_node,
        None,
        nodes,
        step.local_rank,
        1,
        delivers_signals=not step.pty,
    )
    values = {"num_machines": nodes, "machine_rank": step.node_rank}
    words = {
        "num_machines": (
            f"SLURM's {_count(nodes, 'node')} (SLURM_STEP_NUM_NODES)",
            "SLURM_STEP_NUM_NODES",
        ),
        "machine_rank": ("SLURM's node rank {value} (SLURM_NODEID)", "SLURM_NODEID"),
    }
    if nodes == 1:  # one machine: no address nor port to agree on
        return Cluster(place, NO_CLUSTER.derived, Layer(CLUSTER, values, SLURM, words, IGNORE))
    return _with_main(step, place, values, words, port, IGNORE)


def _rank_mode(step: SlurmStep, tasks: int, port: Layer) -> Cluster:
    place = Place(
        step.job_id,
        step.node_rank,
        step.num_nodes,
        step.this_node,
        step.global_rank,
        step.num_tasks,
        step.local_rank,
        tasks,
        delivers_signals=not step.pty,
    )
    without_agent = (
        f"SLURM's {tasks} tasks on each node, which run the script without torch's "
        "agent (SLURM_STEP_TASKS_PER_NODE)",
        "SLURM_STEP_TASKS_PER_NODE",
    )
    values = {
        "num_processes": 1,
        "num_machines": step.num_tasks,
        "machine_rank": step.global_rank,
        "rdzv_backend": "static",
        "max_restarts": 0,
    }
    words = {
        "num_processes": (
            f"one process in each of SLURM's tasks, {tasks} on each node "
            "(SLURM_STEP_TASKS_PER_NODE)",
            "SLURM_STEP_TASKS_PER_NODE",
        ),
        "num_machines": (
            f"SLURM's {step.num_tasks} tasks (SLURM_STEP_NUM_TASKS)",
            "SLURM_STEP_NUM_TASKS",
        ),
        "machine_rank": ("SLURM's task rank {value} (SLURM_PROCID)", "SLURM_PROCID"),
        "rdzv_backend": without_agent,
        "max_restarts": without_agent,
    }
    escape = (
        "start one task per node (srun --ntasks-per-node=1) and let mpslaunch start the "
        f"processes, or {IGNORE}"
    )
    return _with_main(step, place, values, words, port, escape)


def _with_main(
    step: SlurmStep, place: Place, values: dict, words: dict, port: Layer, escape: str
) -> Cluster:
    """The cluster with machine 0's address (the step's first node) and port."""
    if step.main_node is not None:  # else the user's --main_process_ip (_check_step)
        values["main_process_ip"] = step.main_node
        words["main_process_ip"] = (
            "SLURM's first node {value} (SLURM_STEP_NODELIST)",
            "SLURM_STEP_NODELIST",
        )
    if port.kind == CLUSTER:  # MASTER_PORT is set: a fact like the others
        values.update(port.values)
        words.update(port.words)
        port = NO_CLUSTER.derived
    return Cluster(place, port, Layer(CLUSTER, values, SLURM, words, escape))


def _port(step: SlurmStep, environ: Mapping[str, str]) -> Layer:
    """MASTER_PORT when the job sets it (a fact), else one derived from the job and step ids
    (a default: the user may give --main_process_port)."""
    text = environ.get("MASTER_PORT")
    if text is not None:
        if not (text.strip().isdecimal() and 1 <= int(text) <= 65535):
            raise MpslaunchError(
                f"MASTER_PORT={text!r} is not a TCP port from 1 to 65535; fix "
                "it, or unset it and mpslaunch derives one from SLURM's job id"
            )
        return Layer(
            CLUSTER,
            {"main_process_port": int(text)},
            SLURM,
            {"main_process_port": ("MASTER_PORT={value} in the environment", "MASTER_PORT")},
        )
    port = derived_port(step.job_id, step.step_id)
    return Layer(
        DEFAULT,
        {"main_process_port": port},
        SLURM,
        {
            "main_process_port": (
                f"port {{value}} derived from SLURM job {step.job_id}",
                f"derived from SLURM job {step.job_id}",
            )
        },
    )


def derived_port(job_id: str, step_id: str) -> int:
    import zlib  # in a step only: a checksum every task computes alike (hash() is salted)

    return DERIVED_PORT_FIRST + zlib.crc32(f"{job_id}.{step_id}".encode()) % DERIVED_PORT_COUNT


def _check_step(step: SlurmStep, user: Settings) -> int:
    """What mpslaunch cannot run in this step, refused; the tasks on each node."""
    if step.heterogeneous:
        raise MpslaunchError(
            f"SLURM job {step.job_id} is a heterogeneous job, whose components mpslaunch cannot "
            "join into one run; start the run in one component (the same tasks on every node), "
            f"or {IGNORE} and give the machines yourself (--num_machines, --machine_rank, "
            "--main_process_ip)"
        )
    tasks = step.tasks_on_each_node
    if tasks is None:
        counts = ",".join(map(str, step.tasks_per_node))
        raise MpslaunchError(
            f"SLURM's step puts {counts} tasks on its {step.num_nodes} nodes "
            "(SLURM_STEP_TASKS_PER_NODE), and mpslaunch needs as many on every node: give srun "
            "--ntasks-per-node=1 (mpslaunch starts each node's processes) or --ntasks-per-node=N "
            f"(one per GPU), or {IGNORE}"
        )
    several = step.num_nodes > 1 or tasks > 1
    if several and step.main_node is None and not user.main_process_ip:
        raise MpslaunchError(
            f"cannot read SLURM's node list ({step.node_list_error}), so the first node, where "
            "the run meets, is unknown; give --main_process_ip with its address (the same on "
            f"every task), or {IGNORE}"
        )
    return tasks


def _check_allocation(allocation: SlurmAllocation | None) -> None:
    """A job of several nodes or tasks seen from outside any srun step: one launcher there
    would train alone while the job's other nodes wait."""
    if allocation is None:
        return
    nodes, tasks = allocation.num_nodes or 1, allocation.num_tasks or 1
    if nodes == 1 and tasks == 1:
        return
    where = "batch script" if allocation.batch else "salloc shell"
    size = _count(nodes, "node") if nodes > 1 else _count(tasks, "task")
    raise MpslaunchError(
        f"this is the {where} of SLURM job {allocation.job_id}, outside any srun step, and the "
        f"job has {size}: a launch here would train alone while the job's other "
        f"{'nodes' if nodes > 1 else 'tasks'} wait; start it on every node with srun "
        f"(`{ONE_TASK_PER_NODE}`), or {IGNORE} and run here alone"
    )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' if number != 1 else ''}"


# ---------------------------------------------------------------- the plan in a step


def rank_mode_problem(
    place: Place, device: str, machine: Machine, environ: Mapping[str, str]
) -> str | None:
    """Why each of the node's tasks cannot have a device of its own, or None."""
    tasks = place.local_world
    if device == "mps":
        return (
            f"SLURM's {tasks} tasks on {place.node} (SLURM_STEP_TASKS_PER_NODE) cannot all "
            "train on mps: only one process can use a Mac's GPU; start one task per node "
            f"({ONE_TASK_PER_NODE}), or give --cpu"
        )
    gpus = len(machine.cuda_devices)
    if device == "cuda" and tasks > gpus:
        shown = environ.get("CUDA_VISIBLE_DEVICES")
        seen = f"{_count(gpus, 'NVIDIA GPU')}" + (
            f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else ""
        )
        return (
            f"SLURM's {tasks} tasks on {place.node} (SLURM_STEP_TASKS_PER_NODE) each need a "
            f"GPU of their own, and this task sees {seen}; where SLURM gives each task its own "
            "GPU (--gpus-per-task, --gpu-bind), a script's cuda:LOCAL_RANK points past it, so "
            f"give each task the node's GPUs (--gpus-per-node={tasks}), run at most {gpus} "
            f"tasks per node, or start one task per node ({ONE_TASK_PER_NODE})"
        )
    return None


def rank_variables(place: Place, settings: Settings) -> dict[str, str]:
    """What torchrun would give this rank, from the step: its rank, its node's, the world's size
    and where rank 0 serves the script's store."""
    if settings.main_process_ip is None:  # the plan refuses a step with no first node first
        raise ValueError("rank mode without the address of the step's first node")
    return {
        "RANK": str(place.rank),
        "LOCAL_RANK": str(place.local_rank),
        "WORLD_SIZE": str(place.world),
        "LOCAL_WORLD_SIZE": str(place.local_world),
        "GROUP_RANK": str(place.node_rank),
        "MASTER_ADDR": settings.main_process_ip,
        "MASTER_PORT": str(settings.main_process_port or DEFAULT_PORT),
    }


def with_slurm_config(
    place: Place, grace_period: float, kill_wait: int | None, proctrack: str | None
) -> tuple[Place, tuple[str, ...]]:
    """The place with what the cluster's configuration says (`scontrol show config`: KillWait,
    ProctrackType; None when unknown), and its warnings."""
    if proctrack == "proctrack/pgid":  # SLURM signals the task's process group only
        place = place._replace(delivers_signals=False)
    if kill_wait is None or grace_period <= kill_wait:
        return place, ()
    return place, (
        f"SLURM kills a cancelled job's processes {kill_wait} s after its SIGTERM "
        f"(KillWait), before the {grace_period:g} s of --grace_period end: the script "
        f"has {kill_wait} s to save; before a time limit, sbatch --signal=USR1@SECONDS "
        "sends it a signal earlier",
    )
