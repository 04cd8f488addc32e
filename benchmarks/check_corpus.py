"""`mpslaunch check` measured on real training scripts: recall and precision per rule.

The labels (a JSON file) were written by reading each script before running the check on it:

    {"plans": {"mps": ["mps", 1, "Darwin"], "cpu": ["cpu", 1, "Linux", [3, 12]], ...},
     "scripts": {"name": {"file": "owner+repo/train.py", "repository": "...", "path": "...",
                          "commit": "...", "set": "development",
                          "expected": {"mps": [["cpu-fallback", 24], ["cuda-device", 7, "utils.py"]],
                                       "cpu": [...]}}}}

A finding is (rule, line) in the script itself, or (rule, line, module) in a module of its
folder that the check reads with it. Each plan's findings are compared with the labels: a found
finding that is labelled is right; one that is not is wrong (it lowers precision); a labelled
one that is not found is missed (it lowers recall). The scripts are other people's code: they
stay outside the repository, under FOLDER (`file` is relative to it); a script marked `own`
was written for the set and lies beside the labels file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections import Counter
from pathlib import Path

FALLBACK = "cpu-fallback"


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        sys.exit(f"check_corpus: cannot read {path} ({error})")


def targets(labels: dict) -> dict:
    from mpslaunch.check import Target

    return {name: Target(spec[0], spec[1], spec[2], *([tuple(spec[3])] if len(spec) > 3 else []))
            for name, spec in labels["plans"].items()}


def place(finding, script: Path) -> tuple | None:
    """(rule, line) for a finding in the script, (rule, line, module) in a module of its folder,
    None elsewhere."""
    path = Path(os.path.realpath(finding.file))
    folder = Path(os.path.realpath(script)).parent
    if path == Path(os.path.realpath(script)):
        return finding.rule, finding.line
    if path.is_relative_to(folder):
        return finding.rule, finding.line, path.relative_to(folder).as_posix()
    return None


def run(folder: Path, labels: dict, own: Path, chosen: str | None):
    from mpslaunch.check import check_script
    from mpslaunch.output import MpslaunchError

    right, wrong, missed = Counter(), Counter(), Counter()
    by_plan: dict[str, Counter] = {plan: Counter() for plan in labels["plans"]}
    crashes, mismatches = [], []
    fallback_named: dict[str, bool] = {}
    plans = targets(labels)
    scripts = {name: entry for name, entry in labels["scripts"].items()
               if chosen is None or entry.get("set") == chosen}
    for name, entry in sorted(scripts.items()):
        script = (own if entry.get("own") else folder) / entry["file"]
        for plan, target in plans.items():
            expected = {tuple(item) for item in entry["expected"].get(plan, [])}
            try:
                report = check_script(script, target)
            except MpslaunchError as error:
                crashes.append(f"{name} [{plan}]: refused: {error}")
                continue
            except Exception:  # noqa: BLE001 - a crash is what this counts
                crashes.append(f"{name} [{plan}]: {traceback.format_exc().strip().splitlines()[-1]}")
                continue
            found = {where for where in (place(f, script) for f in report.findings) if where}
            by_plan[plan].update(right=len(found & expected), wrong=len(found - expected),
                                 missed=len(expected - found))
            for item in found & expected:
                right[item[0]] += 1
            for item in found - expected:
                wrong[item[0]] += 1
                mismatches.append(f"wrong  {name} [{plan}] {':'.join(map(str, item))}")
            for item in expected - found:
                missed[item[0]] += 1
                mismatches.append(f"missed {name} [{plan}] {':'.join(map(str, item))}")
            if plan == "mps" and any(item[0] == FALLBACK for item in expected):
                fallback_named[name] = any(item[0] == FALLBACK for item in found)
    return len(scripts), right, wrong, missed, crashes, mismatches, fallback_named, by_plan


def ratio(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def table(right: Counter, wrong: Counter, missed: Counter) -> list[str]:
    lines = [f"{'rule':20} {'labelled':>8} {'found':>6} {'right':>6} {'wrong':>6} {'recall':>7} {'precision':>9}"]
    rules = sorted(set(right) | set(wrong) | set(missed))
    for rule in [*rules, "all"]:
        r = sum(right.values()) if rule == "all" else right[rule]
        w = sum(wrong.values()) if rule == "all" else wrong[rule]
        m = sum(missed.values()) if rule == "all" else missed[rule]
        lines.append(f"{rule:20} {r + m:8} {r + w:6} {r:6} {w:6} {ratio(r, r + m):>7} {ratio(r, r + w):>9}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the scripts (each `file` of the labels is relative to it)")
    parser.add_argument("--labels", type=Path, help="the labels (default: FOLDER/labels.json)")
    parser.add_argument("--set", dest="chosen", help="only the scripts of this set (development, held out)")
    parser.add_argument("--details", action="store_true", help="list each wrong and missed finding")
    options = parser.parse_args()
    path = options.labels or options.folder / "labels.json"
    labels = load(path)
    count, right, wrong, missed, crashes, mismatches, fallback_named, by_plan = run(
        options.folder, labels, path.parent, options.chosen)
    import mpslaunch

    print(f"{count} scripts{f' ({options.chosen})' if options.chosen else ''}, plans: "
          f"{', '.join(labels['plans'])}; the check from {Path(mpslaunch.__file__).parent}")
    print("\n".join(table(right, wrong, missed)))
    print("by plan: " + "; ".join(
        f"{plan} {c['right'] + c['missed']} labelled, {c['right']} right, {c['wrong']} wrong"
        for plan, c in by_plan.items()))
    named = sum(fallback_named.values())
    print(f"the CPU fall-back named in {named} of the {len(fallback_named)} scripts that have it")
    print(f"crashes or refusals: {len(crashes)}")
    for line in crashes:
        print(f"  {line}")
    if options.details:
        print("\n".join(sorted(mismatches)))
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
