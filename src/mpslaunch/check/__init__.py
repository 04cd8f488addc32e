"""`check`: what will break a training script on a plan, read from its source with `ast`.

The script and the modules it imports from its own folder are parsed, never imported or run,
and torch is never imported. `check_script(path, target)` returns the findings for one target
(a device, a number of processes, a system): each names its line, what will happen there on
that plan, and what to write instead. The parser and the rules are imported only when a check
runs: a launch that reads kept findings (cache.py) needs neither.
"""

from __future__ import annotations

from pathlib import Path

from mpslaunch.check.report import Finding, Report, ordered
from mpslaunch.check.target import Target, described_target

__all__ = ["Finding", "Report", "Target", "check_script", "described_target"]


def check_script(path: Path, target: Target, whole: bool = True) -> Report:
    """The findings for `target`. `whole=False` (launch) parses only the functions and classes
    a rule can be about, and leaves syntax errors elsewhere to Python; the findings are the same.
    Raises ScriptError (reading.py) for a script that cannot be read."""
    from mpslaunch.check.reading import ScriptError, read_sources
    from mpslaunch.check.rules import Rules
    from mpslaunch.check.scan import prepare, scan

    sources = read_sources(path, whole)
    project = prepare(sources.files)
    rules = Rules(target, project)
    try:
        scan(project, rules)
    except RecursionError:  # an expression nested thousands deep (generated code)
        raise ScriptError(f"{sources.files[0].shown} nests expressions too deeply to check; "
                          "check the script by hand, or run it with `mpslaunch launch --no_check`") from None
    return Report(target, tuple(source.shown for source in sources.files), sources.skipped,
                  ordered(rules.findings))
