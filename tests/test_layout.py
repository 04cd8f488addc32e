"""The layout docs/design.md draws holds: at most 12 entries at the top of src/mpslaunch, imports
between its packages point down only, and a package is imported through its `__init__.py`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "mpslaunch"
# Each package may import those on a lower layer (and `output`, the bottom).
LAYERS = {"commands": 4, "launcher": 3, "check": 3, "bench": 3, "run": 2, "plan": 1,
          "settings": 0, "machine": 0, "output": -1}
MODULES = sorted(path for path in SOURCE.rglob("*.py") if path.parent != SOURCE)


def imported(path: Path) -> list[str]:
    """The mpslaunch modules `path` imports, anywhere in it (imports inside functions too)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return [name for name in names if name.startswith("mpslaunch.")]


def test_the_top_holds_twelve_entries_at_most():
    entries = [path.name for path in SOURCE.iterdir() if path.name != "__pycache__"]
    assert len(entries) <= 12, sorted(entries)
    assert set(LAYERS) == {path.stem for path in SOURCE.iterdir()
                           if path.is_dir() and path.name != "__pycache__" or path.stem == "output"}


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(SOURCE)))
def test_imports_point_down_and_through_each_package(path):
    package = path.relative_to(SOURCE).parts[0]
    for name in imported(path):
        parts = name.split(".")
        other = parts[1]
        if other == package:
            continue
        assert LAYERS[other] < LAYERS[package], f"{package} imports {name}, from above or beside it"
        assert len(parts) == 2, f"{package} imports {name}: import it from mpslaunch.{other}"
