"""The findings of launch's check, kept per script and plan while what the check read is unchanged.

A script is launched again and again unchanged; the second launch then reads its findings
instead of parsing it. Each script and plan keeps a small entry of its own, so a launch reads
only its own and concurrent launches never rewrite each other's. An entry is keyed on the
rules (the check's source files: rules_digest), holds the digest of every file read (the
content decides, not the size and the time), the module files that were looked for and missing
(one added later means a fresh check), and the first findings, the ones launch shows, with
their count. A damaged entry means a fresh check that rewrites it; an
entry that cannot be written costs only a check next time and leaves nothing behind.

An entry is written with `marshal`, as Python keeps its own compiled modules: it is built in,
where `json` compiles six regular expressions at its import, which every launch would pay for.
It holds only strings, numbers, booleans, None, lists and dicts, and a Python reads only the
entries of its own version (the plan's Python is part of the key).
"""

from __future__ import annotations

import functools
import marshal
import os
import time

from mpslaunch import Record, __version__, record
from mpslaunch.check.fingerprint import digest, listing
from mpslaunch.check.target import Target
from mpslaunch.settings import current_folder, open_regular

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at every launch
if TYPE_CHECKING:
    from pathlib import Path

    from mpslaunch.check.report import Finding, Report

ENTRIES = "script-checks"  # the folder of entries, in the cache folder
SUFFIX = ".marshal"  # an entry's; any other file there but a temporary one is an old entry
SHOWN = 5  # the findings launch shows; the others are only counted
MOST_ENTRIES = 256  # past this, the entries written longest ago go
MOST_BYTES = 4_000_000  # more than the check reads of a file: a file that grew past it changed
CHECK_FOLDER = os.path.dirname(__file__)


@record
class Kept(Record):
    findings: tuple[Finding, ...]  # the first SHOWN, in the report's order
    count: int  # type: ignore[assignment]  # all of them (the field hides tuple.count, as it may)


def key(script: str | Path, target: Target) -> str:
    """Findings name files relative to the working folder, so it is part of the key."""
    return (
        f"{__version__} | {rules_digest()} | {current_folder()} | {os.path.realpath(script)} "
        f"| {target}"
    )


@functools.cache  # once per process
def rules_digest(folder: str = CHECK_FOLDER) -> str:
    """What the findings of a check rest on besides the files read: the check's source files in
    `folder`, by name, size and time, which change when a rule is declared (registry.py) or its
    code edited, or the package installed anew. Where the folder cannot be listed, the
    declarations themselves (a launch otherwise never imports registry.py, the rule table)."""
    try:
        with os.scandir(folder) as entries:
            files = sorted(
                (entry.name, entry.stat()) for entry in entries if entry.name.endswith(".py")
            )
        parts = [f"{name} {status.st_size} {status.st_mtime_ns}" for name, status in files]
    except OSError:
        from mpslaunch.check import registry

        parts = [repr(registry.RULES)]
    return digest("\n".join(parts).encode("utf-8", "surrogateescape"))


def read(script: str | Path, target: Target, folder: str | Path) -> Kept | None:
    """The kept findings, or None when there are none, a file read changed or the entry is damaged."""
    wanted = key(script, target)
    try:
        with open(open_regular(os.path.join(folder, ENTRIES, _name(wanted))), "rb") as file:
            entry = marshal.loads(file.read())
        if entry["key"] != wanted or not _unchanged(
            entry["read"], entry["absent"], entry["listed"]
        ):
            return None
        findings = tuple(_finding(item) for item in entry["findings"])
        count = entry["count"]
        if type(count) is not int or not len(findings) <= count or len(findings) > SHOWN:
            return None
        return Kept(findings, count)
    except (TypeError, KeyError, ValueError, AttributeError, EOFError, OSError):
        return None  # no entry, or one of another shape: checked again, then rewritten


def save(
    script: str | Path,
    target: Target,
    read: list[tuple[str, str]],
    absent: tuple[str, ...],
    report: Report,
    folder: str | Path,
    listed: tuple[str, str] | None = None,
) -> Kept:
    """Keep the findings of `report`, made from the files `read` (path, digest) while the files
    `absent` were not there (and the folder `listed` held the same scripts); returns what is kept."""
    kept = Kept(report.findings[:SHOWN], len(report.findings))
    name = key(script, target)
    entry = {
        "key": name,
        "read": [list(pair) for pair in read],
        "absent": list(absent),
        "listed": list(listed) if listed else None,
        "findings": [finding._asdict() for finding in kept.findings],
        "count": kept.count,
    }
    from pathlib import Path  # only when a check ran: a launch that reads findings needs none

    entries = Path(folder, ENTRIES)
    try:
        entries.mkdir(parents=True, exist_ok=True)
        _write(entries / _name(name), marshal.dumps(entry))
        _prune(entries)
    except OSError:
        pass  # a full disk, a read-only cache: checked again next time
    return kept


def _name(wanted: str) -> str:
    return digest(wanted.encode("utf-8", "surrogateescape")) + SUFFIX


def _unchanged(read: list, absent: list, listed: list | None) -> bool:
    for path, expected in read:
        try:
            with open(open_regular(path), "rb") as file:
                if digest(file.read(MOST_BYTES)) != expected:
                    return False
        except OSError:
            return False
    if listed is not None:
        folder, expected = listed
        if type(folder) is not str or listing(folder) != expected:
            return (
                False  # a script beside it appeared or went: it may write a file the script loads
            )
    # a folder ends with a separator; a module file that appeared changes what is read
    return not any(
        (os.path.isdir if path.endswith(os.sep) else os.path.isfile)(path) for path in absent
    )


_TEXT = ("file", "rule", "message", "fix")


def _finding(item: dict) -> Finding:
    """A kept finding, checked field by field: a damaged one raises ValueError."""
    from mpslaunch.check.report import Finding  # only for an entry with findings

    if set(item) != set(Finding._fields):
        raise ValueError("another shape")
    if (
        any(type(item[name]) is not str for name in _TEXT)
        or type(item["line"]) is not int
        or type(item["breaks"]) is not bool
        or any(
            not isinstance(value, (str, type(None)))
            for name, value in item.items()
            if name not in (*_TEXT, "line", "breaks")
        )
    ):
        raise ValueError("a damaged finding")
    return Finding(**item)


def _write(path: Path, data: bytes) -> None:
    """Write through a temporary file, removed whatever happens (a full disk, Ctrl-C): readers
    see the old entry or the new one."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _prune(entries: Path) -> None:
    """At most MOST_ENTRIES entries, and no temporary file left by a process that was killed."""
    now = time.time()
    kept = []
    for path in entries.iterdir():
        try:
            modified = path.stat().st_mtime
            if path.name.endswith(".tmp") and now - modified > 600:
                path.unlink(missing_ok=True)
            elif not path.name.endswith(".tmp"):
                kept.append((modified, path))
        except OSError:
            continue  # removed meanwhile by another launch
    for _, path in sorted(kept)[:-MOST_ENTRIES]:
        path.unlink(missing_ok=True)
