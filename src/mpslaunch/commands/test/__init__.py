"""`mpslaunch test`: launch the bundled check script (selfcheck.py) with the plan `launch` would
make, then merge each rank's report into one line per check. The reports are the verdict, not
the child's exit code (a crash leaves no report).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mpslaunch import run
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import add_option, add_table_options, request_from_args

HELP = """\
Check that the plan works on this machine, through the real launch path: it runs a
small check script the way `mpslaunch launch` would, and prints one line per check:
the device each process got, a training step, whether the device computes the CPU's
numbers (a small model's training steps against the CPU in float64), the mixed
precision, the MPS fallback (on mps) and an all-reduce (with several processes). Each failure says what to change;
--json prints the plan and the checks as JSON instead. Exit status: 0 when every
check passes, 1 when one fails, 2 when the plan itself is impossible here.

examples:
  mpslaunch test
  mpslaunch test --profile cpu4
  mpslaunch test --cpu --num_processes 2
  mpslaunch test --json
"""
CHECK_SCRIPT = Path(__file__).with_name("selfcheck.py")
DEFAULT_TIMEOUT = 300.0
EXIT_FAILED = 1


GRACE_SECONDS = 5.0  # the check script stops at once


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(
        parser,
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="a process that takes longer fails its check (default: %(default)g)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the plan and the checks as JSON, for a bug report",
    )
    which = parser.add_argument_group("which profile (default: default.yaml in the config folder)")
    add_table_options(which, "profile", "config_file")
    plan = parser.add_argument_group(
        "what to test, as for `mpslaunch launch` (default: the profile)"
    )
    add_table_options(plan, "cpu", "device", "mixed_precision", "num_processes")


def main(args: argparse.Namespace) -> int:
    from mpslaunch import launcher

    if not args.timeout > 0:
        raise MpslaunchError("--timeout must be a number of seconds above 0")
    with tempfile.TemporaryDirectory(prefix="mpslaunch-test-") as report_dir:
        plan = resolve_plan(args, report_dir)
        launcher.announce(plan, stream=sys.stderr if args.json else sys.stdout)
        # The child's code is not the verdict: the reports are (a crash leaves none).
        child_code = launcher.execute(plan)
        outcomes = collect(Path(report_dir), plan.settings.num_processes, child_code)
    passed = bool(outcomes) and all(o.ok for o in outcomes)
    print(as_json(plan, outcomes, passed) if args.json else format_outcomes(outcomes))
    return 0 if passed else EXIT_FAILED


def resolve_plan(args: argparse.Namespace, report_dir: str):
    """The plan `mpslaunch launch` would make for the check script, with what to expect."""
    from mpslaunch import launcher

    request = request_from_args(
        _with_launch_defaults(args), str(CHECK_SCRIPT), ("--report-dir", report_dir)
    )
    plan = launcher.prepare(request, args.profile, args.config_file)
    return plan._replace(command=(*plan.command, *expectations(plan, args.timeout)))


def _with_launch_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The parsed flags, and launch's defaults for the options `test` does not take."""
    from mpslaunch.settings import REQUEST_OPTIONS

    given = {"grace_period": GRACE_SECONDS, **vars(args)}
    return argparse.Namespace(
        **{
            option.name: given.get(option.name, option.request_default)
            for option in REQUEST_OPTIONS
        }
    )


def expectations(plan, timeout: float) -> tuple[str, ...]:
    # What the child will actually see for the fallback: the plan's value, or the user's own.
    fallback = plan.env.get(
        "PYTORCH_ENABLE_MPS_FALLBACK", os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK", "1")
    )
    return (
        "--expect-device",
        plan.device,
        "--expect-precision",
        plan.settings.mixed_precision,
        "--expect-world-size",
        str(plan.world_size),
        "--expect-mps-fallback",
        "1" if fallback.strip() == "1" else "0",
        "--timeout",
        str(timeout),
    )


@dataclass(frozen=True)
class Outcome:
    """One check over all local ranks."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    figures: dict = field(default_factory=dict)  # rank -> what the check measured (--json)


def collect(report_dir: Path, expected_ranks: int, child_code: int) -> list[Outcome]:
    reports = _read_reports(report_dir)
    outcomes = _merge_checks(reports)
    if len(reports) < expected_ranks:
        missing = expected_ranks - len(reports)
        outcomes.append(
            Outcome(
                "report",
                False,
                f"{missing} of {expected_ranks} process(es) ended without a report "
                f"(launcher exit code {child_code})",
                "the check script crashed before reporting; its error is printed above; "
                "run `mpslaunch env` and report both",
            )
        )
    elif child_code != 0 and all(outcome.ok for outcome in outcomes):
        # Every check passed, then a process ended badly: not "all passed" under a failure line.
        outcomes.append(
            Outcome(
                "exit",
                False,
                f"every check passed, then the launcher ended with exit code {child_code}, not 0: "
                "its line above says which process and how",
                f"when that line says torch's exit aborted ({run.EXIT_ABORT_ISSUE}), the checks hold and "
                "your scripts may end the same way; otherwise run `mpslaunch env` and report both",
            )
        )
    return outcomes


def _read_reports(report_dir: Path) -> list[dict]:
    reports = []
    for path in sorted(report_dir.glob("rank-*.json")):
        try:
            reports.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # counted as missing
    return sorted(reports, key=lambda report: report.get("rank", 0))


def _merge_checks(reports: list[dict]) -> list[Outcome]:
    """A check passes only if it passed on every rank; a failure names the ranks it failed on."""
    by_name: dict[str, list[tuple[int, dict]]] = {}
    for report in reports:
        for check in report.get("checks", []):
            by_name.setdefault(check["name"], []).append((report.get("rank", 0), check))
    outcomes = []
    for name, results in by_name.items():
        figures = {str(rank): check["figures"] for rank, check in results if check.get("figures")}
        failed = [(rank, check) for rank, check in results if not check["ok"]]
        if not failed:
            outcomes.append(Outcome(name, True, _passed_detail(results), figures=figures))
            continue
        ranks = ", ".join(str(rank) for rank, _ in failed)
        first = failed[0][1]
        where = f"rank{'s' if len(failed) > 1 else ''} {ranks}: " if len(reports) > 1 else ""
        outcomes.append(
            Outcome(name, False, where + first["detail"], first.get("fix", ""), figures)
        )
    return outcomes


def _passed_detail(results: list[tuple[int, dict]]) -> str:
    detail = results[0][1]["detail"]
    return detail if len(results) == 1 else f"{detail} (all {len(results)} ranks)"


def as_json(plan, outcomes: list[Outcome], passed: bool) -> str:
    return json.dumps(
        {
            "plan": plan.summary(),
            "device": plan.device,
            "mixed_precision": plan.settings.mixed_precision,
            "processes": plan.world_size,
            "passed": passed,
            "checks": [asdict(o) for o in outcomes],
        },
        indent=2,
    )


def format_outcomes(outcomes: list[Outcome]) -> str:
    if not outcomes:
        return "FAIL  no check ran; run `mpslaunch env` and report its output"
    width = max(len(o.name) for o in outcomes)
    lines = []
    for o in outcomes:
        lines.append(f"{'PASS' if o.ok else 'FAIL'}  {o.name.ljust(width)}  {o.detail}")
        if not o.ok and o.fix:
            lines.append(f"      {''.ljust(width)}  what to change: {o.fix}")
    failed = sum(not o.ok for o in outcomes)
    lines.append(
        f"mpslaunch test: {len(outcomes) - failed} of {len(outcomes)} checks passed"
        if failed
        else f"mpslaunch test: all {len(outcomes)} checks passed"
    )
    return "\n".join(lines)
