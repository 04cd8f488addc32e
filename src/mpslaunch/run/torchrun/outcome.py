"""What a torchrun run ends with: the launcher's exit code and one summary line. Pure.

The exit code is the first failing rank's own (128+N when signal N killed it, or stopped the
launcher); the summary names the rank, how it ended and where its log is (or that the disk
holding the log is full, when the log is empty for that reason).
Then how each other rank of this machine ended: also failed by itself, stopped by the launcher
(and whether it stopped within the grace period or was killed), or exited 0.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mpslaunch.run.processes import exit_code
from mpslaunch.run.summary import crash_meaning

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any


@dataclass(frozen=True)
class RankFailure:
    """The first failure torch's agent reported (torch's ProcessFailure, reduced)."""

    rank: int
    local_rank: int
    pid: int
    exitcode: int  # negative: killed by that signal (Popen's convention)
    log_folder: str | None  # the rank's stdout.log, stderr.log (and error.json from @record)


def from_torch(rank: int, failure, log_root: str, run_id: str) -> RankFailure:
    folder = rank_log_folder(log_root, run_id, failure.local_rank)
    return RankFailure(
        rank, failure.local_rank, failure.pid, failure.exitcode, str(folder) if folder else None
    )


def largest_own_failure(failures: Mapping[int, Any], stopped: Mapping[int, int]) -> int:
    """The rank, among those that failed by themselves (not one the launcher stopped: local
    ranks in `stopped`), with the largest exit code: in a SLURM step srun reports its tasks'
    largest code, so each node reports its ranks' largest, and the script's own code is what a
    failure on any node gives srun, whichever failed first (torch times failures in seconds)."""
    own = {
        rank: failure for rank, failure in failures.items() if failure.local_rank not in stopped
    } or failures
    return max(own, key=lambda rank: (exit_code(own[rank].exitcode), -rank))


def other_endings(
    first: RankFailure,
    failures: Mapping[int, Any],
    local_ranks: int,
    stopped: Mapping[int, int] | None = None,
) -> dict[int, int]:
    """How this machine's other ranks ended: a rank the launcher stopped as the stop recorded it
    (`stopped`: local rank -> exit code); another as torch reported it (torch before 2.10 reports
    only the ranks that failed before the stop); a rank in neither exited 0."""
    start = first.rank - first.local_rank  # this machine's ranks are consecutive
    stopped = stopped or {}

    def ending(rank: int) -> int:
        if rank - start in stopped:
            return stopped[rank - start]
        return failures[rank].exitcode if rank in failures else 0

    return {rank: ending(rank) for rank in range(start, start + local_ranks) if rank != first.rank}


def stopped_ranks(first: RankFailure, stopped: Mapping[int, int]) -> set[int]:
    """The ranks (global) of the local ranks in `stopped`, on the first failure's machine."""
    return {first.rank - first.local_rank + local_rank for local_rank in stopped}


def rank_log_folder(log_root: str, run_id: str, local_rank: int) -> Path | None:
    """torch writes <log root>/<run id>_<random>/attempt_<n>/<local rank>/: the latest one."""
    runs = sorted(Path(log_root).glob(f"{run_id}_*"), key=lambda path: path.stat().st_mtime)
    if not runs:
        return None
    attempts = sorted(runs[-1].glob("attempt_*"), key=lambda path: _number(path.name))
    folder = attempts[-1] / str(local_rank) if attempts else None
    return folder if folder and folder.is_dir() else None


def _number(name: str) -> int:
    digits = name.rpartition("_")[2]
    return int(digits) if digits.isdigit() else -1


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stopped_on_request(exitcode: int) -> bool:
    """128+N for SIGINT or SIGTERM: by convention, a script that caught the signal and stopped
    (complete_cv_example saves a checkpoint first), not a crash."""
    return exitcode - 128 in STOP_SIGNALS


def how_it_ended(exitcode: int) -> str:
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name} (exit code {exit_code(exitcode)})"
    if stopped_on_request(exitcode):
        return (
            f"exited with code {exitcode}, "
            f"as a script does that stops on {signal.Signals(exitcode - 128).name}"
        )
    return f"exited with code {exitcode}"


# How std::terminate reports a thread ended by the interpreter's shutdown: gloo's worker thread
# drops the last reference to a tensor while Python finalizes, takes the GIL and is unwound.
EXIT_ABORT_LINE = "terminate called without an active exception"
EXIT_ABORT_ISSUE = "https://github.com/pytorch/pytorch/issues/190489"


# What the fault handler (PYTHONFAULTHANDLER) prints after an abort: the threads' stacks follow.
FAULT_HANDLER_ABORT = "Fatal Python error: Aborted"


def aborted_at_exit(failure: RankFailure) -> bool:
    """SIGABRT with std::terminate's line as the last of its stderr (before the fault handler's
    stacks, if it printed them): torch's exit, not the script."""
    if failure.exitcode != -signal.SIGABRT or not failure.log_folder:
        return False
    stderr = Path(failure.log_folder) / "stderr.log"
    try:
        with stderr.open("rb") as stream:
            stream.seek(max(0, stderr.stat().st_size - 4096))
            tail = stream.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return False
    dumps = [index for index, line in enumerate(tail) if line.strip() == FAULT_HANDLER_ABORT]
    if dumps:
        tail = tail[: dumps[-1]]
    return bool(tail) and tail[-1].strip() == EXIT_ABORT_LINE


def failure_summary(
    failure: RankFailure,
    others: Mapping[int, int] | None = None,
    stopped: set[int] | None = None,
    grace_seconds: float | None = None,
    fault_handler: bool = False,
    largest: bool = False,
) -> str:
    """`others`: how this machine's other ranks ended, rank -> exit code (Popen's convention);
    `stopped`: which of them the launcher stopped (None: not known, judged by their codes);
    `fault_handler`: the ranks ran with PYTHONFAULTHANDLER on, so a crash printed their stack;
    `largest`: the failure is the one with the largest code (largest_own_failure), not the first."""
    ended = "stopped" if stopped_on_request(failure.exitcode) else "failed"
    ended += " with the largest code" if largest else " first"
    how = how_it_ended(failure.exitcode)
    if aborted_at_exit(failure):
        how = (
            f"aborted in torch's exit after the script had returned (SIGABRT, exit code "
            f'{exit_code(failure.exitcode)}, "{EXIT_ABORT_LINE}"): a known torch problem '
            f"with gloo, {EXIT_ABORT_ISSUE}"
        )
    elif crash_meaning(failure.exitcode, fault_handler):
        how += f": {crash_meaning(failure.exitcode, fault_handler)}"
    text = f"mpslaunch: rank {failure.rank} {ended}: it {how}"
    folder = Path(failure.log_folder) if failure.log_folder else None
    if folder and disk_full(folder / "stderr.log"):
        text += (
            f"; the disk holding its log folder {folder} is full, so its output (any "
            "traceback too) could not be written: free some space or choose another "
            "--log_dir"
        )
    elif folder and (folder / "stderr.log").is_file():
        text += f"; its stderr (with any traceback) is in {folder / 'stderr.log'}"
    if folder and (folder / "error.json").is_file():  # written by scripts that use torch's @record
        text += f", the error record in {folder / 'error.json'}"
    return "; ".join([text, *_the_others(others or {}, stopped, grace_seconds)])


FULL_BELOW_BYTES = 65536  # less free space than one write of the rank's output may need


def disk_full(log: Path) -> bool:
    """An empty log on a disk with (almost) no space left: the rank's writes failed, not silence."""
    try:
        if log.stat().st_size:
            return False
        disk = os.statvfs(log.parent)
    except OSError:
        return False
    return disk.f_bavail * disk.f_frsize < FULL_BELOW_BYTES


# What torch's agent sends the other ranks once one has failed: SIGTERM, then SIGKILL.
_STOPPED_BY_THE_AGENT = (-signal.SIGTERM, -signal.SIGKILL)


def _the_others(
    others: Mapping[int, int], stopped_by_us: set[int] | None, grace_seconds: float | None
) -> list[str]:
    """Which of the other ranks also failed, which were stopped (or killed when the grace
    period ended), which had exited 0."""

    def was_stopped(rank: int, code: int) -> bool:
        if stopped_by_us is not None and rank not in stopped_by_us:
            return False  # it had ended by itself before the others were stopped
        return code in _STOPPED_BY_THE_AGENT or stopped_on_request(code)

    ordered = sorted(others.items())
    killed = [
        rank
        for rank, code in ordered
        if stopped_by_us is not None and rank in stopped_by_us and code == -signal.SIGKILL
    ]
    stopped = [rank for rank, code in ordered if was_stopped(rank, code) and rank not in killed]
    exited = [rank for rank, code in ordered if code == 0]
    parts = [
        f"rank {rank} also failed: it {how_it_ended(code)}"
        for rank, code in ordered
        if rank not in stopped and rank not in killed and code != 0
    ]
    if stopped:
        parts.append(f"{_ranks(stopped)} {'was' if len(stopped) == 1 else 'were'} stopped")
    if killed:
        within = f" within --grace_period {grace_seconds:g} s" if grace_seconds is not None else ""
        parts.append(
            f"{_ranks(killed)} did not stop{within} and "
            f"{'was' if len(killed) == 1 else 'were'} killed (SIGKILL)"
        )
    if exited:
        parts.append(f"{_ranks(exited)} exited with code 0")
    return parts


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def stopped_summary(signum: int, killed_at: int | None = None, ranks_started: bool = True) -> str:
    """The run was stopped by `signum` (the first stopping signal), hence 128+signum, however the
    ranks ended: `killed_at` None: they stopped; 0: some were still running when the grace period
    ended and were killed; N: some were still running when signal N came, and were killed."""
    name = signal.Signals(signum).name
    if not ranks_started:
        how = " before the ranks started"
    elif killed_at is None:
        how = "; every rank was stopped"
    elif killed_at == 0:
        how = "; some ranks did not stop in time (--grace_period) and were killed"
    else:
        came = "came again" if killed_at == signum else "came"
        how = (
            f"; {signal.Signals(killed_at).name} {came} while the ranks were stopping, so "
            "those still running were killed"
        )
    return f"mpslaunch: stopped by {name}{how} (exit code {128 + signum})"
