"""Start-up timing: when each phase before the first step ended, for metrics.json."""

from __future__ import annotations

import time


class StartupClock:
    """Unix times of the start-up phases, reported in metrics.json as seconds since the
    process started: where the time before the first step goes."""

    def __init__(self):
        self.marks: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        self.marks.setdefault(phase, time.time())

    def since(self, start: float | None) -> dict[str, float]:
        return {phase: at - start for phase, at in self.marks.items()} if start else {}


STARTUP = StartupClock()


def process_start_time() -> float | None:
    try:
        import psutil  # an Accelerate dependency
        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - the metric is optional
        return None
