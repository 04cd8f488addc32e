"""Ctrl-C before the script starts: while the launcher's modules load and while it makes the plan,
`mpslaunch launch` ends with one line and exit code 130, never a traceback, and runs nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# SIGINT to the launcher itself at a chosen point, then the program as its console script runs it.
PROGRAM = """
import os, signal, sys
where = sys.argv.pop(1)
if where == "import":  # while `mpslaunch.commands` is being imported
    class Trap:
        def find_spec(self, name, path, target=None):
            if name == "mpslaunch.commands":
                os.kill(os.getpid(), signal.SIGINT)
            return None
    sys.meta_path.insert(0, Trap())
else:  # while the plan is made
    from mpslaunch import launcher
    make_plan = launcher.prepare
    def interrupted(*args, **named):
        os.kill(os.getpid(), signal.SIGINT)
        return make_plan(*args, **named)
    launcher.prepare = interrupted
from mpslaunch import command_line
sys.exit(command_line())
"""


@pytest.mark.slow
@pytest.mark.parametrize("where", ["import", "plan"])
def test_ctrl_c_before_the_script_starts_is_one_line_and_130(where: str, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    result = subprocess.run([sys.executable, "-c", PROGRAM, where, "launch", "--cpu", str(script)],
                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 130, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "mpslaunch: stopped by SIGINT before anything ran (exit code 130)"], result.stderr[-2000:]
    assert not ran.exists()
