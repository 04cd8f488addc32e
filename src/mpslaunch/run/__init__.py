"""Running a plan: one process (single.py), or several through torch.distributed.run
(torchrun/), with what the launcher does beside the script while it runs (companion.py).
Everything is imported when a run needs it: --dry_run and the one-process start import
neither psutil nor torch.
"""

from __future__ import annotations

import os
import threading

from mpslaunch import lazy_names
from mpslaunch.output import MpslaunchError

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on every launch
if TYPE_CHECKING:
    from mpslaunch.plan import LaunchPlan

__getattr__ = lazy_names(__name__, {
    "processes": ("environment",),
    "logdir": ("log_dir_problem",),
    "torchrun.elastic": ("run_function",),
    "torchrun.outcome": ("EXIT_ABORT_ISSUE",),
})


def thread_problem(plan: LaunchPlan) -> str | None:
    """Why the plan's script cannot be run from this thread, or None."""
    if plan.engine != "single" and threading.current_thread() is not threading.main_thread():
        return ("several processes of a script are started from the main thread only (stopping "
                "them needs its signal handlers); call from the main thread, or run one process here")
    return None


def describe(plan: LaunchPlan) -> str:
    """What --dry_run prints."""
    if plan.engine == "single":
        text = plan.describe()
    else:
        # imports torch: several processes only
        from mpslaunch.run.torchrun import elastic as torchrun

        text = torchrun.describe(plan)
    return text + (f"\nmps check:       {plan.mps_verdict}" if plan.mps_verdict else "")


def execute(plan: LaunchPlan, report: bool = False) -> int:
    """Run the plan; the child's exit code (128+N when signal N ended it). `report`: memory
    warnings and the end-of-run line (launch without -q)."""
    from mpslaunch.run.supervisor import holding_stops

    with holding_stops() as held:  # a stop from the plan line on is the run's
        from mpslaunch.run.companion import Watch

        watch = Watch.for_plan(plan, report, os.environ)
        if plan.engine == "single":
            from mpslaunch.run.single import run_child

            return run_child(plan.command, plan.env, plan.grace_period, plan.log_dir, watch,
                             plan.removed, delivered=_delivered(plan), held=held)
        problem = thread_problem(plan)
        if problem:
            raise MpslaunchError(problem)
        from mpslaunch.run.torchrun import elastic as torchrun

        return torchrun.run(plan, plan.grace_period, watch, held)


def _delivered(plan: LaunchPlan) -> bool:
    """SLURM signals every process of the step itself (plan/slurm.py), so the launcher does
    not forward what it gets."""
    return plan.cluster is not None and plan.cluster.delivers_signals
