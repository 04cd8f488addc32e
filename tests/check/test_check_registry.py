"""The rules are declared once (check/registry.py): docs/check.md's table names each with the
plans it applies to, each has its code and nothing undeclared runs, and the findings launch
keeps are keyed on the rules, so a rule added changes what launch shows for a script seen before."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, write_script

import mpslaunch
from mpslaunch.check import Target, cache, registry
from mpslaunch.check import rules as _rules  # noqa: F401 - imports the code behind each rule


def docs_table() -> list[tuple[str, str]]:
    """(rule, plans) of each row of docs/check.md's table of rules."""
    text = (REPO / "docs" / "check.md").read_text()
    return re.findall(r"^\| `([a-z0-9-]+)` \| ([^|]+?) \|", text, re.M)


def test_the_docs_table_names_each_rule_with_the_plans_it_applies_to():
    assert docs_table() == [(rule.name, rule.plans.shown) for rule in registry.RULES]


def test_each_rule_has_its_code_and_only_declared_rules_run():
    assert set(registry.IMPLEMENTATIONS) == set(registry.BY_NAME)
    assert len(registry.BY_NAME) == len(registry.RULES)


def test_the_plans_of_a_rule_decide_where_it_speaks():
    mac, linux_cpu, linux_cpu_2 = Target("mps", 1, "Darwin"), Target("cpu", 1, "Linux"), Target("cpu", 2, "Linux")
    assert registry.BY_NAME["pin-memory-mps"].plans.applies(mac)
    assert not registry.BY_NAME["pin-memory-mps"].plans.applies(linux_cpu)
    nccl = registry.BY_NAME["nccl-cpu"].plans
    assert nccl.applies(linux_cpu_2) and not nccl.applies(linux_cpu)
    assert not any(rule.plans.applies(Target("cuda", 1, "Linux")) for rule in registry.RULES
                   if not rule.name.startswith("workers-"))


# One more rule, declared and implemented in a copy of the package: `print()` named as a finding.
ANOTHER_RULE = """
RULES += (Rule("print-call", NO_CUDA, "print()", ("print",), ("print(",),
               {"print": "print() writes to the console"}, {"print": "use logging"}, breaks=False),)
BY_NAME = {rule.name: rule for rule in RULES}
"""
ITS_CODE = """

@implements("print-call")
def _print_call(rules, call, where, name, qualified):
    rules.add(where, call, "print-call", "print")
"""


def launch_warnings(tmp_path, package: Path | None = None) -> list[str]:
    """The warnings of a launch of train.py, by the installed mpslaunch or the one in `package`."""
    env = {**os.environ, **({"PYTHONPATH": str(package)} if package else {})}
    result = subprocess.run([sys.executable, "-m", "mpslaunch", "launch", "--dry-run", "--cpu", "train.py"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("mpslaunch: warning: ")]


def with_another_rule(folder: Path) -> Path:
    """A copy of the mpslaunch package in `folder` whose check has one more rule."""
    copy = folder / "mpslaunch"
    shutil.copytree(Path(mpslaunch.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "check" / "registry.py", "a") as registry_file:
        registry_file.write(ANOTHER_RULE)
    with open(copy / "check" / "precision.py", "a") as code_file:
        code_file.write(ITS_CODE)
    return folder


@pytest.mark.slow
def test_a_rule_added_changes_what_launch_shows_for_a_script_seen_before(tmp_path, isolated_cache_dir):
    write_script(tmp_path, "train.py", "import torch\n\nprint(torch.ones(2).sum())\n")
    edited = with_another_rule(tmp_path / "edited")
    assert launch_warnings(tmp_path) == []  # checked, and the (empty) findings kept
    assert launch_warnings(tmp_path) == []  # read back
    # the script is unchanged; the rules are not
    assert launch_warnings(tmp_path, edited) == [
        "mpslaunch: warning: train.py:3: print() writes to the console; use logging"]
    assert launch_warnings(tmp_path) == []  # and back without it
    assert len(list((isolated_cache_dir / "script-checks").iterdir())) == 2  # one entry per set of rules


def test_the_rules_digest_follows_the_check_s_files_or_else_the_declarations(tmp_path, monkeypatch):
    copy = tmp_path / "check"
    shutil.copytree(cache.CHECK_FOLDER, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = cache.rules_digest(str(copy))
    (copy / "registry.py").write_text((copy / "registry.py").read_text() + "\n")
    cache.rules_digest.cache_clear()
    assert cache.rules_digest(str(copy)) != before
    unlisted = cache.rules_digest(str(tmp_path / "gone"))
    cache.rules_digest.cache_clear()
    monkeypatch.setattr(registry, "RULES", registry.RULES[:-1])
    assert cache.rules_digest(str(tmp_path / "gone")) != unlisted
    cache.rules_digest.cache_clear()
