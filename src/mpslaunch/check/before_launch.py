"""The check `mpslaunch launch` runs first: the findings for its plan as warnings, at most five,
then the command that shows them all. Kept findings are read back when no file changed."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from mpslaunch import output
from mpslaunch.check import cache, check_script
from mpslaunch.check.report import launch_warnings
from mpslaunch.check.target import Target
from mpslaunch.output import MpslaunchError
from mpslaunch.machine import cache_dir

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at every launch
if TYPE_CHECKING:
    from mpslaunch.settings import LaunchRequest
    from mpslaunch.plan import LaunchPlan


def warn(request: LaunchRequest, plan: LaunchPlan) -> None:
    """What `launch` runs first, for a .py script: the main findings as warnings on stderr. A
    script that cannot be read is left to Python, which says why when it starts."""
    if request.module or request.no_python or not request.target.endswith(".py"):
        return
    script = Path(request.target)
    target = Target(plan.device, plan.world_size, os.uname().sysname)  # the plan is this machine's
    folder = cache_dir()
    report = cache.read(script, target, folder)
    if report is None:
        try:
            report = check_script(script, target, whole=False)
        except MpslaunchError:
            return
        cache.save(script, target, report, folder)
    command = ["mpslaunch", "check", *_plan_options(request, plan), request.target]
    for line in launch_warnings(report, shlex.join(command)):
        output.warning(line)


def _plan_options(request: LaunchRequest, plan: LaunchPlan) -> list[str]:
    """The options that make `check` see the plan launch saw, when the command line chose it."""
    options = []
    if request.cpu or request.device:
        options += ["--device", plan.device]
    if request.num_processes is not None or request.num_machines is not None:
        options += ["--num_processes", str(plan.world_size)]
    return options
