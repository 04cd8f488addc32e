"""The grace period when a rank fails: the other ranks get --grace_period to stop, not torch's 30 s.

When a rank fails (or before a restart), torch's agent stops the other ranks through its
process context's close(): SIGTERM, a wait, then SIGKILL. On that path torch waits a fixed
30 s whatever its shutdown_timeout says, so a rank that saves a checkpoint for 40 s is killed
mid-save, and a short --grace_period is not kept either. For the run, close() waits the
launcher's grace period instead, and remembers which ranks were still running when it was
called: those were stopped by the launcher; the others had ended by themselves.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator


@dataclass
class RankStops:
    grace_seconds: float
    stopped_pids: set[int] = field(default_factory=set)  # ranks still running at a close()
    followed: bool = False  # False: this torch has no close() to follow; nothing is known


@contextmanager
def graceful_stops(grace_seconds: float) -> Iterator[RankStops]:
    stops = RankStops(grace_seconds)
    try:
        from torch.distributed.elastic.multiprocessing.api import PContext
    except ImportError:
        yield stops
        return
    original = PContext.close

    def close(context, death_sig=None, timeout=30):
        stops.stopped_pids |= _running(context)
        original(context, death_sig=death_sig, timeout=grace_seconds)

    PContext.close = close
    stops.followed = True
    try:
        yield stops
    finally:
        PContext.close = original


def _running(context) -> set[int]:
    """The pids of the context's ranks that have not exited (script ranks: Popen handlers)."""
    handlers = getattr(context, "subprocess_handlers", None) or {}
    return {handler.proc.pid for handler in handlers.values() if handler.proc.poll() is None}
