"""Findings and how they are shown: one line each, `file:line: what happens; what to write`."""

from __future__ import annotations

from mpslaunch import Record, record
from mpslaunch.check.target import Target
from mpslaunch.output import one_line

FALLBACK = "cpu-fallback"  # the rule whose findings come first


@record
class Finding(Record):
    file: str
    line: int
    rule: str  # a short stable name, for tools (--json)
    message: str  # what will happen on this plan
    fix: str  # what to write instead
    breaks: bool  # the run stops (else it runs, but not as written)
    fact: str | None = None  # the docs/mps-facts.md section the finding rests on

    def line_text(self) -> str:
        return f"{self.file}:{self.line}: {self.message}; {self.fix}"


@record
class Report(Record):
    target: Target
    files: tuple[str, ...]  # the files read, the script first
    skipped: tuple[str, ...]  # local modules that could not be read, one line each
    findings: tuple[Finding, ...]  # a CPU fall-back, what stops the run, then by file and line


def ordered(findings: list[Finding]) -> tuple[Finding, ...]:
    """Without duplicates (one message, one line): a CPU fall-back first, since it decides how
    fast the whole run is (and launch shows the first few), then what stops the run, each
    file's in order."""
    unique = {
        (finding.file, finding.line, finding.rule, finding.message): finding for finding in findings
    }
    files = list(dict.fromkeys(finding.file for finding in findings))
    return tuple(
        sorted(
            unique.values(),
            key=lambda f: (f.rule != FALLBACK, not f.breaks, files.index(f.file), f.line, f.rule),
        )
    )


def as_text(report: Report) -> str:
    lines = [finding.line_text() for finding in report.findings]
    lines += [f"not checked: {line}" for line in report.skipped]
    count = len(report.findings)
    if count:
        lines.append(f"{count} finding{'s' if count > 1 else ''} for {report.target.describe()}")
    else:
        lines.append(
            f"nothing found for {report.target.describe()} in {len(report.files)} "
            f"file{'s' if len(report.files) > 1 else ''}"
        )
    if report.skipped:  # the summary must not read as if everything was looked at
        lines[-1] += f"; {len(report.skipped)} not checked (above)"
    return "\n".join(map(one_line, lines))  # a file name's escapes and newlines shown escaped


def as_json(report: Report) -> str:
    import json  # only for --json

    target = report.target._asdict()
    target["start_method"] = report.target.start_method
    return json.dumps(
        {
            "plan": target,
            "files": list(report.files),
            "skipped": list(report.skipped),
            "findings": [finding._asdict() for finding in report.findings],
        },
        indent=2,
    )
