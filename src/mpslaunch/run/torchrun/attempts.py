"""Restarts (--max_restarts): one line each time the ranks start again, and how many there were.

After a failure, while restarts are left, torch's agent stops every rank of this machine and
starts them again, and says so only in its own log, which the launcher silences. Two things
it does are what the launcher follows: for each attempt it asks its LogsSpecs for the log
folders (`reify`, with every rank's environment, TORCHELASTIC_RESTART_COUNT among it; see
run/torch_internals.py), and the
failure that ended an attempt goes to the torch.distributed.elastic.multiprocessing logger as
"failed (exitcode: N) local_rank: R ...". When a torch version words that record differently,
the restart line still comes, without the rank and code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from mpslaunch.run.torchrun.outcome import how_it_ended

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any

FAILURE_LOGGER = "torch.distributed.elastic.multiprocessing.api"


@dataclass
class Attempts:
    """What the run's attempts so far were; `announce` prints one line."""

    max_restarts: int
    announce: Callable[[str], None]
    restarts: int = 0
    ranks: dict[int, str] = field(default_factory=dict)  # local rank -> global rank, this attempt
    failure: tuple[int, int] | None = None  # (exit code, local rank) that ended the last attempt

    def started(self, envs: dict[int, dict[str, str]]) -> None:
        """torch is starting an attempt's ranks (their environments, by local rank)."""
        attempt = int(next(iter(envs.values()), {}).get("TORCHELASTIC_RESTART_COUNT", "0"))
        if attempt > self.restarts:
            self.restarts = attempt
            self.announce(self.restart_line())
        self.ranks = {local: env.get("RANK", "?") for local, env in envs.items()}
        self.failure = None

    def restart_line(self) -> str:
        if self.failure is None:
            cause = "a rank failed"
        else:
            code, local_rank = self.failure
            cause = f"rank {self.ranks.get(local_rank, '?')} {how_it_ended(code)}"
        return (f"mpslaunch: {cause}; starting every rank again "
                f"(restart {self.restarts} of {self.max_restarts})")

    def counted(self) -> str:
        """For the final summary: '1 restart of --max_restarts 2'; '' without restarts."""
        if not self.restarts:
            return ""
        plural = "s" if self.restarts > 1 else ""
        return f"{self.restarts} restart{plural} of --max_restarts {self.max_restarts}"


class FailureRecords(logging.Handler):
    """Takes the failure that ended an attempt from torch's log record (nothing is printed)."""

    def __init__(self, attempts: Attempts):
        super().__init__(logging.ERROR)
        self.attempts = attempts

    def emit(self, record: logging.LogRecord) -> None:
        args: tuple[Any, ...] = record.args if isinstance(record.args, tuple) else ()
        if str(record.msg).startswith("failed (exitcode") and len(args) >= 2:
            try:
                self.attempts.failure = (int(args[0]), int(args[1]))
            except (TypeError, ValueError):
                pass


@contextmanager
def following(attempts: Attempts) -> Iterator[None]:
    """For the run: failures logged by torch reach `attempts`."""
    logger, handler = logging.getLogger(FAILURE_LOGGER), FailureRecords(attempts)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
