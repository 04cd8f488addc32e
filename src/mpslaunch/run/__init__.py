"""Running a plan: the engine that `plan.engine` names (ENGINES), with what the launcher does
beside the script while it runs (companion.py). Each engine module offers `describe(plan) -> str`
(what --dry_run prints) and `run(plan, watch, held) -> int` (the exit code). Everything is
imported when a run needs it: --dry_run and the one-process start import neither psutil nor torch.
"""

from __future__ import annotations

import os
import threading

from mpslaunch import lazy_names
from mpslaunch.output import MpslaunchError

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on every launch
if TYPE_CHECKING:
    from types import ModuleType

    from mpslaunch.plan import LaunchPlan

__getattr__ = lazy_names(
    __name__,
    {
        "processes": ("environment",),
        "logdir": ("log_dir_problem",),
        "torchrun.elastic": ("run_function",),
        "torchrun.outcome": ("EXIT_ABORT_ISSUE",),
    },
)

# plan.engine -> the module that runs it, imported on first use (the torchrun one imports torch).
# Its keys are the plan's ENGINES (tests/test_layout.py holds them together).
ENGINES = {
    "single": "mpslaunch.run.single",  # one child process
    "torchrun": "mpslaunch.run.torchrun.elastic",  # several, through torch.distributed.run
}


def engine(plan: LaunchPlan) -> ModuleType:
    """The module that runs `plan` (ENGINES)."""
    import importlib  # imported at every start already

    return importlib.import_module(ENGINES[plan.engine])


def thread_problem(plan: LaunchPlan) -> str | None:
    """Why the plan's script cannot be run from this thread, or None."""
    if plan.engine != "single" and threading.current_thread() is not threading.main_thread():
        return (
            "several processes of a script are started from the main thread only (stopping "
            "them needs its signal handlers); call from the main thread, or run one process here"
        )
    return None


def describe(plan: LaunchPlan) -> str:
    """What --dry_run prints."""
    text = engine(plan).describe(plan)
    return text + (f"\nmps check:       {plan.mps_verdict}" if plan.mps_verdict else "")


def execute(plan: LaunchPlan, report: bool = False) -> int:
    """Run the plan; the child's exit code (128+N when signal N ended it). `report`: memory
    warnings and the end-of-run line (launch without -q)."""
    from mpslaunch.run.supervisor import holding_stops

    with holding_stops() as held:  # a stop from the plan line on is the run's
        from mpslaunch.run.companion import Watch

        watch = Watch.for_plan(plan, report, os.environ)
        problem = thread_problem(plan)
        if problem:
            raise MpslaunchError(problem)
        return engine(plan).run(plan, watch, held)
