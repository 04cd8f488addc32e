"""The findings of launch's check, kept per script and plan until one of the files changes.

A script is launched again and again unchanged; the second launch then reads its findings
instead of parsing it. An entry holds each file's size and modification time; any difference,
or a damaged cache file, means a fresh check. A cache that cannot be written costs only a
check next time.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from mpslaunch import __version__
from mpslaunch.check.report import Finding, Report
from mpslaunch.check.target import Target

CACHE_FILE = "script-checks.json"
_ENTRIES = 64


def key(script: Path, target: Target) -> str:
    return f"{__version__} | {os.getcwd()} | {script.resolve()} | {target}"


def read(script: Path, target: Target, folder: Path) -> Report | None:
    entry = _entries(folder).get(key(script, target))
    try:
        if not entry or any(_stamp(Path(path)) != stamp for path, stamp in entry["stamps"]):
            return None
        return Report(target, tuple(entry["files"]), tuple(entry["skipped"]),
                      tuple(Finding(**finding) for finding in entry["findings"]))
    except (TypeError, KeyError, ValueError, OSError):
        return None  # an entry of another shape: checked again, then rewritten


def save(script: Path, target: Target, report: Report, folder: Path) -> None:
    try:
        stamps = [[str(path.resolve()), _stamp(path)] for path in _paths(script, report)]
        entries = {name: value for name, value in _entries(folder).items() if name != key(script, target)}
        entries[key(script, target)] = {"stamps": stamps, "files": list(report.files),
                                        "skipped": list(report.skipped),
                                        "findings": [asdict(finding) for finding in report.findings]}
        kept = dict(list(entries.items())[-_ENTRIES:])
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{CACHE_FILE}.{os.getpid()}.tmp"
        partial.write_text(json.dumps(kept), encoding="utf-8")
        os.replace(partial, folder / CACHE_FILE)  # readers see the old file or the new one
    except OSError:
        pass


def _paths(script: Path, report: Report) -> list[Path]:
    """The files read: the script, and the modules named relative to where the check ran."""
    return [script, *(Path(shown) for shown in report.files[1:])]


def _stamp(path: Path) -> list[int]:
    status = path.stat()
    return [status.st_size, status.st_mtime_ns]


def _entries(folder: Path) -> dict:
    try:
        entries = json.loads((folder / CACHE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}
