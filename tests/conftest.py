"""The fixtures and hooks every test gets: an isolated config, cache and temporary folder, the
local SLURM for the tests marked `slurm`, and the fast lane's guard (a test that starts a process
is marked `slow`). The helpers the tests share are in helpers.py."""

from __future__ import annotations

import _posixsubprocess
import ast
import os
import subprocess
from pathlib import Path

import pytest

from helpers import REQUIRE_SLURM, SlurmCluster, local_slurm, slurm_conf, why_slurm_cannot_start


@pytest.fixture(autouse=True)
def isolated_config_dir(tmp_path_factory, monkeypatch) -> Path:
    """No test ever reads or writes the real user's profiles."""
    folder = tmp_path_factory.mktemp("config")
    monkeypatch.setenv("MPSLAUNCH_CONFIG_DIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def isolated_cache_dir(tmp_path_factory, monkeypatch) -> Path:
    """No test ever reads or writes the real user's cached mps verdicts."""
    folder = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("MPSLAUNCH_CACHE_DIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def isolated_temporary_dir(tmp_path_factory, monkeypatch) -> Path:
    """Launches write their temporary folders (a failed run's logs) under the test's own
    folders, which pytest removes, and never in the shared /tmp."""
    import tempfile

    folder = tmp_path_factory.mktemp("tmp")
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


# ---------------------------------------------------------------- the fast lane

# Every way a test's process starts another: subprocess (and so run_cli, torch's launcher, SLURM's
# commands, tmux, the C compiler), multiprocessing's spawn and fork, os.system. Each with where
# the command is among its arguments.
_STARTS = ((subprocess.Popen, "_execute_child", 1), (_posixsubprocess, "fork_exec", 0),
           (os, "posix_spawn", 1), (os, "posix_spawnp", 1), (os, "fork", None),
           (os, "forkpty", None), (os, "system", 0))


# A first `import torch` inside a test asks ldconfig where its libraries are (ctypes.util's
# find_library): torch's lookup, not a process the test starts.
_LIBRARY_LOOKUP = "ldconfig"


class StartsAProcess(RuntimeError):
    """A test that is not marked slow started a process."""


@pytest.fixture(autouse=True)
def processes_only_in_slow_tests(request, monkeypatch):
    """A test that starts a process is marked `slow`, so that `-m "not slow"` stays fast: one
    that is not fails, even where the code under test catches the refusal."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    started: list[str] = []

    def refuse(name: str, command_at: int | None, original):
        def refused(*args, **kwargs):
            command = args[command_at] if command_at is not None and len(args) > command_at else ""
            if isinstance(command, (list, tuple)) and command \
                    and os.path.basename(os.fsdecode(command[0])) == _LIBRARY_LOOKUP:
                return original(*args, **kwargs)
            started.append(f"{name}: {command!r}"[:300])
            raise StartsAProcess(f"{request.node.nodeid} starts a process but is not marked slow")
        return refused

    for owner, name, command_at in _STARTS:
        if hasattr(owner, name):
            monkeypatch.setattr(owner, name, refuse(name, command_at, getattr(owner, name)))
    yield
    if started:
        pytest.fail(f"this test starts a process ({started[0]}) but is not marked slow: mark it "
                    "@pytest.mark.slow, or its file with pytestmark = pytest.mark.slow "
                    "(tests/README.md: Running it)", pytrace=False)


def pytest_ignore_collect(collection_path: Path, config):
    """The fast lane (-m "not slow") does not even import a file whose every test is slow (its
    module-level pytestmark says so): importing some costs seconds (the examples import
    torchvision, scikit-learn and Accelerate), and none of their tests would run."""
    if config.getoption("markexpr") != "not slow" or not collection_path.name.startswith("test_") \
            or collection_path.suffix != ".py":
        return None
    tree = ast.parse(collection_path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "pytestmark"
                                                for target in node.targets):
            marks = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            if any(ast.unparse(mark) == "pytest.mark.slow" for mark in marks):
                return True
    return None


# ---------------------------------------------------------------- SLURM


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local SLURM: the one running, or one started for this test run and stopped at its end
    (as root, with the packages installed); else the test skips, saying why."""
    if (running := local_slurm("status", timeout=30)).returncode == 0:
        yield SlurmCluster(slurm_conf(running))
        return
    if reason := why_slurm_cannot_start():
        pytest.skip(reason)
    started = local_slurm("start", timeout=120)
    if started.returncode != 0:
        pytest.skip(f"the local SLURM did not start: {started.stderr.strip()[-500:]}")
    try:
        yield SlurmCluster(slurm_conf(started))
    finally:
        if "already running" not in started.stdout:  # else another test run started it meanwhile
            local_slurm("stop", timeout=60)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Where SLURM must run (MPSLAUNCH_REQUIRE_SLURM=1, as in CI), a slurm test that skipped failed."""
    report = yield
    if report.skipped and item.get_closest_marker("slurm") and os.environ.get(REQUIRE_SLURM) == "1":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"{REQUIRE_SLURM}=1 and this slurm test skipped: {reason}"
    return report
