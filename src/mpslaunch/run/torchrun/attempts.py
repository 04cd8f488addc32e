"""Restarts (--max_restarts): one line each time the ranks start again, and how many there were.

After a failure, while restarts are left, torch's agent stops every rank of this machine and
starts them again, and says so only in its own log, which the launcher silences. Two things
it does are what the launcher follows (run/torch_internals.py): for each attempt it asks its
LogsSpecs for the log folders (`started`, with every rank's environment,
TORCHELASTIC_RESTART_COUNT among it), and it logs the failure that ended an attempt (`failed`).
When a torch version words that record differently, the restart line still comes, without the
rank and code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mpslaunch.run.torchrun.outcome import how_it_ended


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

    def failed(self, exitcode: int, local_rank: int) -> None:
        """torch's agent logged the failure that ends the attempt."""
        self.failure = (exitcode, local_rank)

    def restart_line(self) -> str:
        if self.failure is None:
            cause = "a rank failed"
        else:
            code, local_rank = self.failure
            cause = f"rank {self.ranks.get(local_rank, '?')} {how_it_ended(code)}"
        return (
            f"mpslaunch: {cause}; starting every rank again "
            f"(restart {self.restarts} of {self.max_restarts})"
        )

    def counted(self) -> str:
        """For the final summary: '1 restart of --max_restarts 2'; '' without restarts."""
        if not self.restarts:
            return ""
        plural = "s" if self.restarts > 1 else ""
        return f"{self.restarts} restart{plural} of --max_restarts {self.max_restarts}"
