"""Rough edges a hostile user finds: a home folder this user cannot read, a broken psutil at the
clean-up, a file name that holds a newline, a script named like an option, a log folder that is
not a folder, and Accelerate files written the ways Accelerate itself reads them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import one_line_error, run_cli, write_script


def unprivileged() -> list[str]:
    """Root keeps its uid (the project's Python stays readable) but loses the right to bypass
    file permissions, as `sudo -u other` with HOME=/root has none."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root reads every folder, and setpriv (to drop that right) is not installed")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def as_other_user(args, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items()
           if key not in ("MPSLAUNCH_CONFIG_DIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "HF_HOME")}
    return subprocess.run([*unprivileged(), sys.executable, "-m", "mpslaunch", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=120,
                          env={**env, "HOME": str(home)}, stdin=subprocess.DEVNULL)


@pytest.fixture
def locked_home(tmp_path):
    """Someone else's home folder, which this user may not enter."""
    home = tmp_path / "home"
    (home / ".config" / "mpslaunch").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "accelerate").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "accelerate" / "default_config.yaml").write_text("use_cpu: true\n")
    home.chmod(0)
    yield home
    home.chmod(0o755)


def test_an_unreadable_home_gives_one_line_or_goes_on(locked_home, tmp_path):
    env = as_other_user(["env"], locked_home, tmp_path)
    assert env.returncode == 0 and "Traceback" not in env.stderr, env.stderr[-2000:]
    assert "mpslaunch" in env.stdout
    shown = as_other_user(["config", "show"], locked_home, tmp_path)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr[-2000:]
    assert "cannot be read" in shown.stdout and "MPSLAUNCH_CONFIG_DIR" in shown.stdout, shown.stdout
    for args in (["config", "--default"], ["config", "--from_accelerate"]):
        line = one_line_error(as_other_user(args, locked_home, tmp_path))
        assert "permission denied" in line and "MPSLAUNCH_CONFIG_DIR" in line, line
