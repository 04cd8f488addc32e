"""`mpslaunch check` measured on real training scripts: recall and precision per rule.

FOLDER holds the scripts and labels.json, written by reading each script before running the
check on it:

    {"plans": {"mps": ["mps", 1, "Darwin"], "cpu": ["cpu", 1, "Linux", [3, 12]], ...},
     "scripts": {"name": {"file": "name.py", "repository": "...", "path": "...", "commit": "...",
                          "expected": {"mps": [["cpu-fallback", 24], ...], "cpu": [...]}}}}

A finding is (rule, line) in the script itself; each plan's findings are compared with the
labels. A found finding that is labelled is right; one that is not is wrong (it lowers
precision); a labelled one that is not found is missed (it lowers recall). The scripts are
other people's code: keep them outside the repository.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections import Counter
from pathlib import Path

FALLBACK = "cpu-fallback"


def load(folder: Path) -> dict:
    try:
        return json.loads((folder / "labels.json").read_text())
    except (OSError, ValueError) as error:
        sys.exit(f"check_corpus: cannot read {folder / 'labels.json'} ({error})")


def targets(labels: dict) -> dict:
    from mpslaunch.check import Target

    return {name: Target(spec[0], spec[1], spec[2], *([tuple(spec[3])] if len(spec) > 3 else []))
            for name, spec in labels["plans"].items()}


def run(folder: Path, labels: dict) -> tuple[Counter, Counter, Counter, list[str], list[str], dict]:
    from mpslaunch.check import check_script
    from mpslaunch.output import MpslaunchError

    right, wrong, missed = Counter(), Counter(), Counter()
    crashes, mismatches = [], []
    fallback_named: dict[str, bool] = {}
    plans = targets(labels)
    for name, entry in sorted(labels["scripts"].items()):
        script = folder / entry["file"]
        for plan, target in plans.items():
            expected = {tuple(pair) for pair in entry["expected"].get(plan, [])}
            try:
                report = check_script(script, target)
            except MpslaunchError as error:
                crashes.append(f"{name} [{plan}]: refused: {error}")
                continue
            except Exception:  # noqa: BLE001 - a crash is what this counts
                crashes.append(f"{name} [{plan}]: {traceback.format_exc().strip().splitlines()[-1]}")
                continue
            found = {(f.rule, f.line) for f in report.findings if Path(f.file).name == script.name}
            for rule, line in found & expected:
                right[rule] += 1
            for rule, line in found - expected:
                wrong[rule] += 1
                mismatches.append(f"wrong  {name} [{plan}] {rule}:{line}")
            for rule, line in expected - found:
                missed[rule] += 1
                mismatches.append(f"missed {name} [{plan}] {rule}:{line}")
            if any(rule == FALLBACK for rule, _ in expected):
                fallback_named[name] = any(rule == FALLBACK for rule, _ in found)
    return right, wrong, missed, crashes, mismatches, fallback_named


def ratio(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def table(right: Counter, wrong: Counter, missed: Counter) -> list[str]:
    lines = [f"{'rule':20} {'labelled':>8} {'found':>6} {'right':>6} {'recall':>7} {'precision':>9}"]
    rules = sorted(set(right) | set(wrong) | set(missed))
    for rule in [*rules, "all"]:
        r = sum(right.values()) if rule == "all" else right[rule]
        w = sum(wrong.values()) if rule == "all" else wrong[rule]
        m = sum(missed.values()) if rule == "all" else missed[rule]
        lines.append(f"{rule:20} {r + m:8} {r + w:6} {r:6} {ratio(r, r + m):>7} {ratio(r, r + w):>9}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the scripts and their labels.json")
    parser.add_argument("--details", action="store_true", help="list each wrong and missed finding")
    options = parser.parse_args()
    labels = load(options.folder)
    right, wrong, missed, crashes, mismatches, fallback_named = run(options.folder, labels)
    print(f"{len(labels['scripts'])} scripts, plans: {', '.join(labels['plans'])}")
    print("\n".join(table(right, wrong, missed)))
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
