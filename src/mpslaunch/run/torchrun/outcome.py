"""What a torchrun run ends with: the launcher's exit code and one summary line. Pure.

The exit code is the first failing rank's own (so `sys.exit(3)` in any rank gives 3), 128+N
when signal N killed it, 128+N when signal N stopped the launcher. The summary names the rank,
how it ended and where its output (with its traceback) is; the traceback itself was already
on the console, prefixed with the rank, so the launcher prints no other.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from mpslaunch.run.processes import exit_code


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
    return RankFailure(rank, failure.local_rank, failure.pid, failure.exitcode,
                       str(folder) if folder else None)


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
    (cv_example saves a checkpoint first), not a crash."""
    return exitcode - 128 in STOP_SIGNALS


def how_it_ended(exitcode: int) -> str:
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name} (exit code {exit_code(exitcode)})"
    if stopped_on_request(exitcode):
        return (f"exited with code {exitcode}, "
                f"as a script does that stops on {signal.Signals(exitcode - 128).name}")
    return f"exited with code {exitcode}"


def failure_summary(failure: RankFailure) -> str:
    ended = "stopped" if stopped_on_request(failure.exitcode) else "failed"
    text = f"mpslaunch: rank {failure.rank} {ended} first: it {how_it_ended(failure.exitcode)}"
    folder = Path(failure.log_folder) if failure.log_folder else None
    if folder and (folder / "stderr.log").is_file():
        text += f"; its stderr (with any traceback) is in {folder / 'stderr.log'}"
    if folder and (folder / "error.json").is_file():  # written by scripts that use torch's @record
        text += f", the error record in {folder / 'error.json'}"
    return text + "; the other ranks were stopped"


def stopped_summary(signum: int) -> str:
    return (f"mpslaunch: stopped by {signal.Signals(signum).name}; every rank was stopped "
            f"(exit code {128 + signum})")
