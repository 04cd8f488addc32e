"""`check`: what will break a training script on a plan, read from its source with `ast`.

The script and the modules it imports from its own folder are parsed, never imported or run,
and torch is never imported. `check_script(path, target)` returns the findings for one target
(a device, a number of processes, a system): each names its line, what will happen there on
that plan, and what to write instead. The parser and the rules are imported only when a check
runs: a launch that reads kept findings (cache.py) needs neither.
"""

from __future__ import annotations

from mpslaunch import lazy_names
from mpslaunch.check.target import Target, described_target

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at every launch
if TYPE_CHECKING:
    from pathlib import Path

    from mpslaunch.check.reading import Sources
    from mpslaunch.check.report import Report

__all__ = ["Finding", "Report", "Target", "check_script", "described_target"]


def check_script(path: Path, target: Target, whole: bool = True) -> Report:
    """The findings for `target`. `whole=False` (launch) parses only the functions and classes
    a rule can be about, and leaves syntax errors elsewhere to Python; the findings are the same.
    Raises ScriptError (reading.py) for a script that cannot be read."""
    from mpslaunch.check.reading import read_sources

    return check_sources(read_sources(path, whole), target)


def check_sources(sources: Sources, target: Target) -> Report:
    """The findings for `target` in sources already read."""
    from mpslaunch.check.reading import TOO_DEEP, Unchecked
    from mpslaunch.check.report import Report, ordered
    from mpslaunch.check.rules import Rules
    from mpslaunch.check.scan import prepare
    from mpslaunch.check.walk import walk_project

    try:
        project = prepare(sources.files, sources.writers)
        rules = Rules(target, project)
        walk_project(project, rules)
    except (RecursionError, MemoryError):  # an expression nested thousands deep (generated code)
        raise Unchecked(sources.files[0].shown, TOO_DEEP) from None
    findings = rules.findings
    script = sources.files[0]
    if script.cells is not None:
        from mpslaunch.check.notebook import in_cells

        findings = in_cells(findings, script.shown, script.cells)
    return Report(
        target, tuple(source.shown for source in sources.files), sources.skipped, ordered(findings)
    )


# Imported on first use: a launch that reads kept findings, none of them, needs no report.
__getattr__ = lazy_names(
    __name__,
    {
        "before_launch": ("Interrupted",),
        "report": ("Finding", "Report", "ordered", "as_json", "as_text"),
    },
)
