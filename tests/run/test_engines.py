"""The engines that run a plan: one table (run.ENGINES) keyed by the plan's engine names, whose
modules are called alike."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from helpers import MACHINES
from mpslaunch import plan, run
from mpslaunch.plan import resolve
from mpslaunch.plan.decision import SINGLE, TORCHRUN
from mpslaunch.settings import LaunchRequest, Profile

SOURCE = Path(__file__).resolve().parents[2] / "src" / "mpslaunch"
MODULES = {name: importlib.import_module(path) for name, path in run.ENGINES.items()}


def test_the_table_has_a_module_for_each_engine_the_plan_names_and_no_other():
    assert sorted(run.ENGINES) == sorted(plan.ENGINES)


def test_the_plan_chooses_its_engine_by_the_names_it_declares():
    """Wherever an engine is given (`engine=`), it is one of plan/decision.py's constants,
    never a string written out, so a name the table lacks cannot be made."""
    given = {}
    for path in SOURCE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "engine":
                parts = list(ast.walk(node.value))
                given[f"{path.name}: {ast.unparse(node.value)}"] = (
                    {part.id for part in parts if isinstance(part, ast.Name) and part.id.isupper()},
                    [part.value for part in parts if isinstance(part, ast.Constant)])
    assert given, "no engine= found: the test looks in the wrong place"
    for where, (constants, written) in given.items():
        assert written == [] and constants <= {"SINGLE", "TORCHRUN"} and constants, where
    assert {SINGLE, TORCHRUN} == set(plan.ENGINES)


@pytest.mark.parametrize("function", ["describe", "run"])
def test_every_engine_is_called_alike(function):
    signatures = {name: inspect.signature(getattr(module, function))
                  for name, module in MODULES.items()}
    assert len(set(signatures.values())) == 1, signatures
    assert list(signatures["single"].parameters) == (
        ["plan"] if function == "describe" else ["plan", "watch", "held"])


@pytest.mark.parametrize("flags, engine", [
    ({}, "mpslaunch.run.single"),
    ({"num_processes": 2}, "mpslaunch.run.torchrun.elastic"),
])
def test_a_plan_is_run_by_its_engines_module(flags, engine):
    made = resolve(Profile(), LaunchRequest("train.py", cpu=True, **flags), MACHINES["linux_cpu"], {})
    assert run.engine(made).__name__ == engine
