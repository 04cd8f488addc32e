"""SLURM as this process sees it, read from an environment mapping: SLURM's compressed node lists
and task counts, the srun step a task runs in, and a job seen from outside any step (a batch
script without srun, an salloc shell). Facts and parse errors only: what to refuse is the plan's.
Standard library only; only `kill_wait_seconds` starts a process (scontrol), when called.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping

from mpslaunch import Record, record

# SLURM's own hostlist refuses a range of more than 65,536 names; a whole list past that is
# refused here too, before anything is expanded.
MAX_NODES = 65_536

# Patterns, compiled (and kept by re) when first used: a launch outside SLURM uses none.
_RANGE = r"(\d+)(?:-(\d+))?"
_BRACKETS = r"\[([^\[\]]*)\]"
_TASK_COUNT = r"(\d+)(?:\(x(\d+)\))?"
# A component after the first: SLURM 22.05 also sets SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0 in the
# steps of an ordinary batch job (measured), so component 0 alone says nothing.
_HETEROGENEOUS = r"SLURM_\w+_(HET|PACK)_GROUP_([1-9]\d*)"


class SlurmVariableError(ValueError):
    """A step's variable is missing or cannot be read; the message names it and its value."""


def expand_hostlist(text: str) -> tuple[str, ...]:
    """The node names of SLURM's compressed list, in its order: `node[01-03,07]` is node01,
    node02, node03, node07 (zero padding kept); several bracket groups in one name are a cross
    product (`rack[1-2]-n[1-2]`), as scontrol reads them. ValueError for what scontrol cannot
    read, and for what it reads in surprising ways (a stray or unterminated bracket, a space)."""
    expressions = _split_names(text)
    plans = [_name_parts(expression, text) for expression in expressions]
    count = sum(math.prod(_count(part) for part in parts) for parts in plans)
    if count > MAX_NODES:
        raise ValueError(f"the node list {text!r} names {count} nodes, more than {MAX_NODES}")
    return tuple(
        "".join(name)
        for parts in plans
        for name in itertools.product(*(_choices(part) for part in parts))
    )


def _split_names(text: str) -> list[str]:
    """The comma-separated names of a node list, commas inside brackets kept."""
    if not text.strip():
        raise ValueError("the node list is empty")
    names, start, depth = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"the node list {text!r} has a bracket inside a bracket")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"the node list {text!r} has a ']' without its '['")
        elif char == "," and depth == 0:
            names.append(text[start:index])
            start = index + 1
        elif char.isspace():
            raise ValueError(f"the node list {text!r} holds a space")
    if depth:
        raise ValueError(f"the node list {text!r} has a '[' without its ']'")
    return names + [text[start:]]


# A part of a name: a fixed text, or a bracket group's ranges (first, last, width), where each
# number is written at least `width` digits wide (zero padding: the first number's width).
_Part = str | tuple[tuple[int, int, int], ...]


def _name_parts(expression: str, text: str) -> list[_Part]:
    """A name as its row of parts: fixed texts and bracket groups, alternating."""
    if not expression:
        raise ValueError(f"the node list {text!r} has an empty name")
    if "[" in expression and not expression.endswith("]"):
        raise ValueError(
            f"the node list {text!r} has text after the last bracket of "
            f"{expression!r}, which SLURM does not read"
        )
    pieces = re.split(_BRACKETS, expression)  # bracket contents at the odd places
    return [_ranges(piece, text) if index % 2 else piece for index, piece in enumerate(pieces)]


def _ranges(group: str, text: str) -> tuple[tuple[int, int, int], ...]:
    ranges = []
    for item in group.split(","):
        match = re.fullmatch(_RANGE, item)
        if not match:
            raise ValueError(
                f"the node list {text!r} has {item!r} in brackets, not a number or a range"
            )
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(first) > int(last):
            raise ValueError(f"the node list {text!r} has the reversed range {item!r}")
        ranges.append((int(first), int(last), len(first)))
    return tuple(ranges)


def _count(part: _Part) -> int:
    return 1 if isinstance(part, str) else sum(last - first + 1 for first, last, _ in part)


def _choices(part: _Part) -> list[str]:
    if isinstance(part, str):
        return [part]
    return [
        str(number).zfill(width) for first, last, width in part for number in range(first, last + 1)
    ]


def expand_tasks_per_node(text: str) -> tuple[int, ...]:
    """SLURM's tasks-per-node count, one number per node: `2(x3),1` is (2, 2, 2, 1)."""
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(_TASK_COUNT, item.strip())
        if not match:
            raise ValueError(f"cannot read the tasks per node {text!r}: {item!r} is not N or N(xM)")
        repeat = int(match.group(2) or 1)
        if repeat == 0:
            raise ValueError(f"cannot read the tasks per node {text!r}: {item!r} repeats no node")
        if len(counts) + repeat > MAX_NODES:
            raise ValueError(f"the tasks per node {text!r} count more than {MAX_NODES} nodes")
        counts += [int(match.group(1))] * repeat
    return tuple(counts)


@record
class SlurmStep(Record):
    """The srun step this task runs in, from the step's own variables (a job's variables such as
    SLURM_NNODES or SLURM_NTASKS describe the allocation, not the step). `nodes` is empty when
    the node list cannot be read, and `node_list_error` says why."""

    job_id: str
    step_id: str
    job_name: str  # "" when SLURM did not say
    node_list: str  # SLURM_STEP_NODELIST, as SLURM wrote it
    nodes: tuple[str, ...]  # the node list expanded, in SLURM's order (SLURM_NODEID indexes it)
    node_list_error: str | None
    num_nodes: int  # SLURM_STEP_NUM_NODES
    num_tasks: int  # SLURM_STEP_NUM_TASKS
    tasks_per_node: tuple[int, ...]  # SLURM_STEP_TASKS_PER_NODE, one count per node
    node_rank: int  # SLURM_NODEID: this task's node among the step's
    local_rank: int  # SLURM_LOCALID: this task among its node's
    global_rank: int  # SLURM_PROCID: this task among the step's
    node_name: str  # SLURMD_NODENAME, "" when SLURM did not say
    heterogeneous: bool  # a heterogeneous job (components with their own node lists)
    pty: bool = False  # srun --pty: a terminal's own signals reach the foreground process only

    @property
    def main_node(self) -> str | None:
        """The first node of the step, where SLURM_NODEID is 0; None when the list is unreadable."""
        return self.nodes[0] if self.nodes else None

    @property
    def tasks_on_each_node(self) -> int | None:
        """The number of tasks on every node when it is the same on all, else None (`2,1`)."""
        return self.tasks_per_node[0] if len(set(self.tasks_per_node)) == 1 else None

    @property
    def this_node(self) -> str:
        """This task's node: SLURMD_NODENAME, else its place in the node list, else its number."""
        if self.node_name:
            return self.node_name
        return self.nodes[self.node_rank] if self.nodes else f"node {self.node_rank}"

    def describe(self) -> str:
        """One line for a bug report: `job 31, step 0 (python): task 3 of 4 on node02, node 2
        of 2 (node[01-02]), 2 tasks on each node`."""
        each = self.tasks_on_each_node
        counts = (
            f"{each} task{'s' if each != 1 else ''} on each node"
            if each is not None
            else f"{','.join(map(str, self.tasks_per_node))} tasks on its nodes"
        )
        return (
            f"job {self.job_id}, step {self.step_id}"
            + (f" ({self.job_name})" if self.job_name else "")
            + f": task {self.global_rank} of {self.num_tasks} on {self.this_node}, node "
            f"{self.node_rank + 1} of {self.num_nodes} ({self.node_list}), {counts}"
            + ("; heterogeneous" if self.heterogeneous else "")
        )


@record
class SlurmAllocation(Record):
    """A SLURM job seen from outside any srun step: its batch script, or an salloc shell. Its
    numbers are None when SLURM did not set them (`sbatch -N2` without a task count sets no
    SLURM_NTASKS) or they cannot be read."""

    job_id: str
    job_name: str
    node_list: str  # SLURM_JOB_NODELIST, as SLURM wrote it
    num_nodes: int | None  # SLURM_JOB_NUM_NODES
    num_tasks: int | None  # SLURM_NTASKS
    batch: bool  # a batch script (SLURM sets ENVIRONMENT=BATCH there), else salloc or alike
    heterogeneous: bool

    def describe(self) -> str:
        """One line for a bug report: `job 31 (wrap), a batch script outside any srun step: 2
        nodes (node[01-02]), 2 tasks`."""
        where = "a batch script" if self.batch else "a shell (salloc)"
        counts = [
            f"{self.num_nodes} node{'s' if self.num_nodes != 1 else ''} ({self.node_list})"
            if self.num_nodes is not None
            else f"nodes {self.node_list or 'unknown'}"
        ]
        if self.num_tasks is not None:
            counts.append(f"{self.num_tasks} task{'s' if self.num_tasks != 1 else ''}")
        return (
            f"job {self.job_id}"
            + (f" ({self.job_name})" if self.job_name else "")
            + f", {where} outside any srun step: {', '.join(counts)}"
            + ("; heterogeneous" if self.heterogeneous else "")
        )


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    """True inside a task that srun started: SLURM_STEP_ID and SLURM_PROCID are both set (a
    batch script has SLURM_PROCID but no step; an salloc shell has neither)."""
    return "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ


def slurm_step(environ: Mapping[str, str]) -> SlurmStep | None:
    """The step this task runs in, or None outside an srun step. SlurmVariableError when a step
    variable is missing, not a number, or contradicts another."""
    if not in_slurm_step(environ):
        return None
    per_node = _variable(environ, "SLURM_STEP_TASKS_PER_NODE", expand_tasks_per_node)
    step = SlurmStep(
        job_id=_required(environ, "SLURM_JOB_ID"),
        step_id=environ["SLURM_STEP_ID"],
        job_name=environ.get("SLURM_JOB_NAME", ""),
        node_list=_required(environ, "SLURM_STEP_NODELIST"),
        nodes=(),
        node_list_error=None,
        num_nodes=_number(environ, "SLURM_STEP_NUM_NODES"),
        num_tasks=_number(environ, "SLURM_STEP_NUM_TASKS"),
        tasks_per_node=per_node,
        node_rank=_number(environ, "SLURM_NODEID"),
        local_rank=_number(environ, "SLURM_LOCALID"),
        global_rank=_number(environ, "SLURM_PROCID"),
        node_name=environ.get("SLURMD_NODENAME", ""),
        heterogeneous=_heterogeneous(environ),
        pty="SLURM_PTY_PORT" in environ,
    )
    _check_counts(step)
    return step._replace(**_expanded_nodes(step))


def slurm_allocation(environ: Mapping[str, str]) -> SlurmAllocation | None:
    """The job this process runs in outside any srun step (a batch script without srun, an
    salloc shell), or None: inside a step, or outside SLURM."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job_id or in_slurm_step(environ):
        return None
    return SlurmAllocation(
        job_id=job_id,
        job_name=environ.get("SLURM_JOB_NAME", ""),
        node_list=environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", ""),
        num_nodes=_optional_number(
            environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")
        ),
        num_tasks=_optional_number(environ.get("SLURM_NTASKS")),
        batch=environ.get("ENVIRONMENT") == "BATCH",
        heterogeneous=_heterogeneous(environ),
    )


def _required(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise SlurmVariableError(f"SLURM set SLURM_STEP_ID but not {name}")
    return value


def _variable(environ: Mapping[str, str], name: str, read):
    value = _required(environ, name)
    try:
        return read(value)
    except ValueError as error:
        raise SlurmVariableError(f"{name}={value!r} cannot be read: {error}") from None


def _number(environ: Mapping[str, str], name: str) -> int:
    number = _variable(environ, name, lambda value: _optional_number(value))
    if number is None:
        raise SlurmVariableError(f"{name}={environ[name]!r} is not a whole number")
    return number


def _optional_number(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdecimal() else None


def _heterogeneous(environ: Mapping[str, str]) -> bool:
    """SLURM marks a heterogeneous job with SLURM_HET_SIZE (SLURM_PACK_SIZE before 20.02) and
    one set of variables per component (`SLURM_JOB_NODELIST_HET_GROUP_1`); an ordinary job may
    have component 0's."""
    return (
        "SLURM_HET_SIZE" in environ
        or "SLURM_PACK_SIZE" in environ
        or any(re.fullmatch(_HETEROGENEOUS, name) for name in environ)
    )


def _check_counts(step: SlurmStep) -> None:
    """The step's numbers agree with each other, as SLURM writes them."""
    per_node = step.tasks_per_node
    if len(per_node) != step.num_nodes:
        _contradiction(
            f"SLURM_STEP_TASKS_PER_NODE counts {len(per_node)} nodes, "
            f"SLURM_STEP_NUM_NODES={step.num_nodes}"
        )
    if sum(per_node) != step.num_tasks:
        _contradiction(
            f"SLURM_STEP_TASKS_PER_NODE counts {sum(per_node)} tasks, "
            f"SLURM_STEP_NUM_TASKS={step.num_tasks}"
        )
    if step.node_rank >= step.num_nodes:
        _contradiction(f"SLURM_NODEID={step.node_rank} with {step.num_nodes} nodes")
    if step.global_rank >= step.num_tasks:
        _contradiction(f"SLURM_PROCID={step.global_rank} with {step.num_tasks} tasks")
    if step.local_rank >= per_node[step.node_rank]:
        _contradiction(
            f"SLURM_LOCALID={step.local_rank} on a node of {per_node[step.node_rank]} tasks"
        )


def _contradiction(problem: str):
    raise SlurmVariableError(f"the step's variables contradict each other: {problem}")


def _expanded_nodes(step: SlurmStep) -> dict:
    try:
        nodes = expand_hostlist(step.node_list)
    except ValueError as error:
        return {"node_list_error": str(error)}
    if len(nodes) != step.num_nodes:
        return {
            "node_list_error": f"SLURM_STEP_NODELIST={step.node_list!r} names {len(nodes)} "
            f"nodes and SLURM_STEP_NUM_NODES={step.num_nodes}"
        }
    return {"nodes": nodes}


_KILL_WAIT = r"^KillWait\s*=\s*(\d+) sec"
_PROCTRACK = r"^ProctrackType\s*=\s*(\S+)"


@record
class SlurmConfig(Record):
    """What the cluster's controller says of how it stops a job; None where it did not say."""

    kill_wait: int | None  # KillWait: seconds between a cancelled job's SIGTERM and SIGKILL
    proctrack: str | None  # ProctrackType: how slurmstepd finds a step's processes


def kill_wait_from_config(text: str) -> int | None:
    """KillWait, the seconds SLURM leaves a job's processes between SIGTERM and SIGKILL, from
    `scontrol show config`'s text; None when it is not there."""
    return config_from_text(text).kill_wait


def config_from_text(text: str) -> SlurmConfig:
    """KillWait and ProctrackType from `scontrol show config`'s text."""
    kill_wait = re.search(_KILL_WAIT, text, re.MULTILINE)
    proctrack = re.search(_PROCTRACK, text, re.MULTILINE)
    return SlurmConfig(
        int(kill_wait.group(1)) if kill_wait else None, proctrack.group(1) if proctrack else None
    )


def slurm_config(timeout: float = 2.0) -> SlurmConfig:
    """The cluster's configuration as its controller says it (`scontrol show config`); unknown
    values when scontrol is missing, fails or does not answer within `timeout` seconds."""
    import subprocess

    try:
        answer = subprocess.run(
            ["scontrol", "show", "config"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return SlurmConfig(None, None)
    return config_from_text(answer.stdout) if answer.returncode == 0 else SlurmConfig(None, None)


def kill_wait_seconds(timeout: float = 2.0) -> int | None:
    """KillWait as the cluster's controller says it, or None when unknown."""
    return slurm_config(timeout).kill_wait
