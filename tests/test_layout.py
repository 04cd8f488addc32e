"""The layout docs/design.md draws holds: at most 12 entries at the top of src/mpslaunch, imports
between its packages point down only, a package is imported through its `__init__.py`, and the
modules of a package import each other without a circle (imports inside functions and for type
checking count: they only hide one), and torch's private API is reached from
run/torch_internals.py alone. And the tests' own layout: a test that starts a process is
marked `slow`, or it fails (conftest.py), so the fast lane stays fast."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, write_script

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


PACKAGES = sorted(path.parent for path in SOURCE.rglob("__init__.py"))


def package_imports(package: Path, dotted: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package (`dotted`) it imports, anywhere in it. `from
    package import name` imports the module `name` when there is one, else the `__init__`."""
    modules = {path.stem for path in package.glob("*.py")}
    graph = {}
    for module in modules:
        found = set()
        for node in ast.walk(ast.parse((package / f"{module}.py").read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.startswith(dotted + "."):
                    part = name[len(dotted) + 1:].split(".")[0]
                    found.add(part if part in modules else "__init__")
        found.discard(module)
        graph[module] = found
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, as the modules along it, or None."""
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for other in sorted(graph.get(module, ())):
            if state.get(other) == "open":
                return path[path.index(other):] + [other]
            if other not in state:
                found = visit(other, [*path, other])
                if found:
                    return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return None


@pytest.mark.parametrize("package", PACKAGES, ids=lambda path: str(path.relative_to(SOURCE.parent)))
def test_no_circle_of_imports_inside_a_package(package):
    dotted = ".".join(("mpslaunch", *package.relative_to(SOURCE).parts))
    assert circle(package_imports(package, dotted)) is None


def test_a_circle_hidden_in_a_function_or_behind_type_checking_is_found(tmp_path):
    for name, text in {"__init__.py": "",
                       "scan.py": "def scan():\n    from mpslaunch.pkg.walk import walk\n",
                       "walk.py": "from mpslaunch.pkg.scan import Where\n",
                       "cache.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n"
                                   "    from mpslaunch.pkg.reading import Sources\n",
                       "reading.py": "from mpslaunch.pkg import cache\n",
                       "report.py": "from mpslaunch.pkg import Finding\n"}.items():
        (tmp_path / name).write_text(text)
    graph = package_imports(tmp_path, "mpslaunch.pkg")
    assert graph["reading"] == {"cache"} and graph["report"] == {"__init__"}
    assert circle({module: graph[module] for module in ("scan", "walk")}) == ["scan", "walk", "scan"]
    assert circle({module: graph[module] for module in ("cache", "reading")}) == ["cache", "reading", "cache"]
    assert circle({module: graph[module] for module in ("report", "__init__", "reading", "cache")}) \
        == ["cache", "reading", "cache"]


# ---------------------------------------------------------------- torch's private API

PRIVATE_TORCH_HOME = SOURCE / "run" / "torch_internals.py"
TORCH_NAME = re.compile(r"torch(\.\w+)+")


def private_torch(dotted: str) -> bool:
    """A name under torch.distributed.elastic, or one with a `_` part (not a dunder such as
    torch.__version__)."""
    parts = dotted.split(".")
    return parts[0] == "torch" and (
        parts[1:3] == ["distributed", "elastic"]
        or any(part.startswith("_") and not part.endswith("__") for part in parts[1:]))


def torch_private_uses(text: str) -> list[str]:
    """What `text` takes from torch's private API: imports, attributes of an imported torch
    module (through its alias too) and dotted names written out (a logger's, importlib's)."""
    tree, aliases, found = ast.parse(text), {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    found.append(alias.name)
                    aliases[alias.asname or "torch"] = alias.name if alias.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "torch":
            for alias in node.names:
                found.append(f"{node.module}.{alias.name}")
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = []
            while isinstance(node, ast.Attribute):
                parts.insert(0, node.attr)
                node = node.value
            if isinstance(node, ast.Name) and node.id in aliases:
                found.append(".".join([aliases[node.id], *parts]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and TORCH_NAME.fullmatch(node.value):
            found.append(node.value)
    return sorted({name for name in found if private_torch(name)})


@pytest.mark.parametrize("path", [path for path in MODULES if path != PRIVATE_TORCH_HOME],
                         ids=lambda path: str(path.relative_to(SOURCE)))
def test_torchs_private_api_is_used_in_torch_internals_only(path):
    assert torch_private_uses(path.read_text(encoding="utf-8")) == [], (
        f"{path.relative_to(SOURCE)} uses torch's private API: move that use into "
        "run/torch_internals.py")


def test_every_way_of_reaching_torchs_private_api_is_found():
    text = ("import torch\nimport torch.distributed as dist\n"
            "from torch.distributed.elastic.multiprocessing import api\n"
            "from torch.distributed import elastic\nfrom torch import _C\n"
            "import torch._dynamo\n"
            "def f():\n    dist._store_based_barrier()\n    return torch.__version__, torch.nn\n"
            "LOGGER = 'torch.distributed.elastic.agent.server.api'\n"
            "WORDS = 'torch.distributed.elastic is named in a sentence'\n")
    assert torch_private_uses(text) == [
        "torch._C", "torch._dynamo", "torch.distributed._store_based_barrier",
        "torch.distributed.elastic", "torch.distributed.elastic.agent.server.api",
        "torch.distributed.elastic.multiprocessing.api"]
    assert torch_private_uses(PRIVATE_TORCH_HOME.read_text(encoding="utf-8"))  # its home uses it


# ---------------------------------------------------------------- the fast lane's guard

STARTING = """
import multiprocessing
import subprocess

import pytest


def test_runs_a_command():
    subprocess.run(["true"], check=True)


def test_runs_a_command_and_swallows_the_refusal():
    try:
        subprocess.run(["true"])
    except Exception:
        pass


def test_spawns_a_worker():
    worker = multiprocessing.get_context("spawn").Process(target=print)
    worker.start()
    worker.join()


@pytest.mark.slow
def test_marked_slow_runs_a_command():
    assert subprocess.run(["true"]).returncode == 0


def test_starts_nothing():
    assert True


def test_looks_up_a_library_as_a_first_import_of_torch_does():
    import ctypes.util
    assert ctypes.util.find_library("c")  # found by ldconfig alone
"""


@pytest.mark.slow
def test_a_test_that_starts_a_process_and_is_not_marked_slow_fails(tmp_path):
    test_file = write_script(tmp_path, "test_starting.py", STARTING)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"),
                                                                      os.environ.get("PYTHONPATH")]))}
    # The suite's conftest as a plugin, with the project's settings (its markers).
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                          "-c", str(REPO / "pyproject.toml"), "-rfE", str(test_file)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    errors = {line.split()[1].split("::")[-1] for line in ran.stdout.splitlines() if line.startswith("ERROR ")}
    assert errors == {"test_runs_a_command", "test_runs_a_command_and_swallows_the_refusal",
                      "test_spawns_a_worker"}, ran.stdout[-3000:]
    assert "this test starts a process (_execute_child: ['true']) but is not marked slow" in ran.stdout
    assert ran.stdout.strip().splitlines()[-1].startswith("2 failed, 4 passed, 3 errors"), ran.stdout[-3000:]
