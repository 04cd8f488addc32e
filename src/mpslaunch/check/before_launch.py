"""The check `mpslaunch launch` runs first: the findings for its plan as warnings, at most five,
then the command that shows them all. Kept findings are read back while the files read are
unchanged. A script the check cannot read is named in one warning and still runs; Ctrl-C
during the check stops the launch before anything runs."""

from __future__ import annotations

import os

from mpslaunch import output, user_folder
from mpslaunch.check import cache, check_sources
from mpslaunch.check.target import Target
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import folder_main

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at every launch
if TYPE_CHECKING:
    from mpslaunch.plan import LaunchPlan
    from mpslaunch.settings import LaunchRequest

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


class Interrupted(MpslaunchError):
    exit_code = EXIT_INTERRUPTED


def warn(request: LaunchRequest, plan: LaunchPlan) -> None:
    """What `launch` runs first, for a .py script: the main findings as warnings on stderr. A
    script with a problem Python reports itself (a syntax error) is left to Python."""
    if request.module or request.no_python:
        return
    script = folder_main(request.target) or request.target  # `python app/` runs its __main__.py
    if os.path.splitext(script)[1] != ".py":
        return
    target = Target(plan.device, plan.world_size, os.uname().sysname)  # the plan is this machine's
    try:
        kept = _findings(script, target, user_folder("cache"))
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while checking {request.target}; nothing ran") from None
    except MpslaunchError as error:
        _not_checked(error)
        return
    command = ["mpslaunch", "check", *_plan_options(request, plan), request.target]
    for line in _warnings(kept, command):
        output.warning(line)


def _findings(script: str, target: Target, folder: str) -> cache.Kept:
    kept = cache.read(script, target, folder)
    if kept is None:
        from pathlib import Path

        from mpslaunch.check.reading import read_sources

        sources = read_sources(Path(script), whole=False)
        kept = cache.save(
            script,
            target,
            sources.read,
            sources.absent,
            check_sources(sources, target),
            folder,
            sources.listed,
        )
    return kept


def _not_checked(error: MpslaunchError) -> None:
    """One warning for a script Python may run but the check cannot read."""
    from mpslaunch.check.reading import Unchecked  # already imported: the check ran

    if isinstance(error, Unchecked):
        output.warning(f"{error.shown} was not checked: {error.reason}")


def _warnings(kept: cache.Kept, command: list[str]) -> list[str]:
    """The first findings, and the command that shows them all."""
    lines = [finding.line_text() for finding in kept.findings]
    rest = kept.count - len(kept.findings)
    if rest > 0:
        import shlex  # only when there are more

        lines.append(f"{rest} more: {shlex.join(command)}")
    return lines


def _plan_options(request: LaunchRequest, plan: LaunchPlan) -> list[str]:
    """The options that make `check` see the plan launch saw, when the command line chose it."""
    options = []
    if request.cpu or request.device:
        options += ["--device", plan.device]
    if request.num_processes is not None or request.num_machines is not None:
        options += ["--num_processes", str(plan.world_size)]
    return options
