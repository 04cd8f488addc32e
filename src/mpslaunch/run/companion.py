"""What the launcher does beside the script while a run lasts, on both run paths: keeps a Mac
awake (awake.py), watches memory pressure (memory_watch.py), and ends with one summary line
(summary.py). The runners only open `watching(...)` around the run and call `ended(...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext

from mpslaunch import Record, output, record


@record
class Watch(Record):
    keep_awake: bool  # the plan's: macOS, unless keep_awake: false or --no_keep_awake
    device: str
    report: bool  # memory warnings and the end line; --quiet turns them off
    fault_handler: bool  # the script runs with PYTHONFAULTHANDLER on, so a crash shows a stack
    failures_only: bool = False  # the end line only when the run failed (rank mode, not rank 0)

    @classmethod
    def for_plan(cls, plan, report: bool, environ: Mapping[str, str]) -> Watch:
        handler = plan.env.get("PYTHONFAULTHANDLER", environ.get("PYTHONFAULTHANDLER", ""))
        return cls(
            plan.keep_awake,
            plan.device,
            report,
            bool(handler) and not plan.no_python,
            plan.silent_rank,
        )


NOTHING = Watch(keep_awake=False, device="", report=False, fault_handler=False)


class Run:
    """The run as the companion sees it: the processes it follows, the clock, the end line."""

    def __init__(self, watch: Watch, processes: Callable[[], Iterable[int]]):
        from mpslaunch.run import summary  # once the script has started: see single.run

        self.watch = watch
        self.followed: list[int] = []
        self.peaks = summary.PeakTracker(lambda: [*self.followed, *processes()])
        self.clock = summary.Clock()

    def follow(self, pid: int) -> None:
        self.followed.append(pid)

    def ended(
        self, code: int, returncode: int | None = None, log_folder: str | None = None
    ) -> None:
        """Print the end line (unless quiet). `returncode`: the one process's Popen code."""
        if not self.watch.report or (self.watch.failures_only and code == 0):
            return
        from mpslaunch.run import summary

        self.peaks.tick()
        crash = (
            summary.native_crash(returncode, self.watch.fault_handler, self.watch.device)
            if returncode is not None
            else None
        )
        largest, total = self.peaks.result()
        output.say(
            summary.end_line(
                self.clock.elapsed(), code, largest, total, log_folder, crash, self.peaks.measure
            )
        )


@contextmanager
def watching(watch: Watch | None, processes: Callable[[], Iterable[int]] = tuple) -> Iterator[Run]:
    """Around a run: caffeinate on a Mac, and (unless quiet) the memory watch. None: nothing."""
    run = Run(watch or NOTHING, processes)
    watch = run.watch
    with _awake(watch.keep_awake):
        if not watch.report:
            yield run
            return
        from mpslaunch.run.memory_watch import MemoryWatch

        watcher = MemoryWatch(watch.device, output.warning, followers=[run.peaks])
        watcher.start()
        try:
            yield run
        finally:
            run.clock.stop()
            watcher.stop()


def _awake(keep_awake: bool):
    """caffeinate around the run when the plan keeps the Mac awake; awake.py (and the machine's
    power facts it reads) is imported only then."""
    if not keep_awake:
        return nullcontext()
    from mpslaunch.run.awake import kept_awake

    return kept_awake(True, output.warning)
