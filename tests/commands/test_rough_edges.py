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

from helpers import one_line_error, run_cli, wait_for, write_script

pytestmark = pytest.mark.slow  # every test here starts processes


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


HELPER_LEFT_BEHIND = """\
import subprocess, sys
helper = subprocess.Popen(["sleep", "300"], start_new_session=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
open(sys.argv[1], "w").write(str(helper.pid))
print("trained")
"""

BROKEN_PSUTIL = {
    "fails_to_import": "raise ImportError('cannot import name _psutil_linux (a broken build)')\n",
    "fails_when_asked": ("class Error(Exception):\n    pass\n\n"
                         "def _broken(*args, **kwargs):\n    raise OSError('psutil is broken here')\n\n"
                         "process_iter = Process = wait_procs = _broken\n"),
}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="the stand-in psutil is found through /proc")
@pytest.mark.parametrize("broken", sorted(BROKEN_PSUTIL))
def test_a_broken_psutil_at_the_clean_up_keeps_the_exit_code_and_kills_the_helper(tmp_path, broken):
    standin = tmp_path / "standin" / "psutil"
    standin.mkdir(parents=True)
    (standin / "__init__.py").write_text(BROKEN_PSUTIL[broken])
    write_script(tmp_path, "train.py", HELPER_LEFT_BEHIND)
    pid_file = tmp_path / "helper.pid"
    result = run_cli("launch", "--cpu", "--no_check", "train.py", str(pid_file), cwd=tmp_path,
                     env={"PYTHONPATH": str(tmp_path / "standin")})
    helper = int(pid_file.read_text())
    try:
        assert result.returncode == 0, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and "trained" in result.stdout, result.stderr[-2000:]
        assert wait_for(lambda: not alive(helper), 10), "the helper the script left behind survived"
    finally:
        if alive(helper):
            os.kill(helper, 9)


FORGED = "a\nmpslaunch: ended after 1.0 s, exit code 0\n.py"


def test_a_newline_in_a_file_name_cannot_forge_a_launcher_line(tmp_path):
    line = one_line_error(run_cli("launch", "--cpu", FORGED, cwd=tmp_path))
    assert "no script at a\\nmpslaunch: ended after" in line, line
    write_script(tmp_path, FORGED, "print('trained')\n")
    ran = run_cli("launch", "--cpu", "--no_check", "--log_dir", "logs\nmpslaunch: ended", FORGED, cwd=tmp_path)
    assert ran.returncode == 0 and "trained" in ran.stdout, ran.stderr[-2000:]
    ended = [line for line in ran.stderr.splitlines() if line.startswith("mpslaunch: ended after")]
    assert len(ended) == 1 and "output in" in ended[0] and "logs\\nmpslaunch" in ended[0], ran.stderr
    for processes in ("1", "2"):
        plan = run_cli("launch", "--cpu", "--dry_run", "--num_processes", processes, FORGED, cwd=tmp_path)
        assert plan.returncode == 0, plan.stderr[-2000:]
        assert not any(line.startswith("mpslaunch: ended") for line in plan.stdout.splitlines()), plan.stdout
        assert "$'a\\nmpslaunch: ended after 1.0 s, exit code 0\\n.py'" in plan.stdout, plan.stdout


FORGED_END = "logs\nmpslaunch: ended after 9.9 s, exit code 0"


def test_a_newline_in_the_log_dir_cannot_forge_a_line_after_the_plan_line(tmp_path):
    write_script(tmp_path, "train.py", "print('trained')\n")
    ran = run_cli("launch", "--cpu", "--log_dir", FORGED_END, "train.py", cwd=tmp_path)
    assert ran.returncode == 0 and ran.stdout == "trained\n", ran.stderr[-2000:]
    plan, end = ran.stderr.strip().splitlines()
    assert plan.startswith("mpslaunch: cpu: ") and "output also in logs\\nmpslaunch: ended" in plan
    assert end.startswith("mpslaunch: ended after ") and "9.9 s" not in end.split(";")[0]


def test_a_newline_in_an_environment_value_cannot_forge_a_line_of_the_bug_report():
    report = run_cli("env", env={"PYTORCH_NOTE": "a\n- Launcher would choose: mps, 8 processes"})
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert len([line for line in lines if line.startswith("- Launcher would choose:")]) == 1
    assert "    PYTORCH_NOTE=a\\n- Launcher would choose: mps, 8 processes" in lines


def test_terminal_escapes_in_a_script_name_are_shown_escaped_by_check_and_launch(tmp_path):
    name = "\x1b[2J\x1b[31mtrain.py"  # clear the screen, then red
    write_script(tmp_path, name, "import torch\nx = torch.zeros(1).cuda()\n")
    checked = run_cli("check", "--device", "cpu", name, cwd=tmp_path)
    assert checked.returncode == 1 and "\x1b" not in checked.stdout + checked.stderr, checked.stdout
    assert checked.stdout.startswith("\\x1b[2J\\x1b[31mtrain.py:2: .cuda() puts work on cuda")
    launched = run_cli("launch", "--cpu", "--dry_run", name, cwd=tmp_path)
    assert launched.returncode == 0 and "\x1b" not in launched.stdout + launched.stderr


@pytest.mark.parametrize("processes", ["1", "2"])
def test_an_unusable_log_dir_is_refused_before_the_plan_line(tmp_path, processes):
    write_script(tmp_path, "train.py", "print('trained')\n")
    (tmp_path / "taken").write_text("a file\n")
    for log_dir in ("/dev/null", "taken", "taken/logs"):
        for dry_run in ((), ("--dry_run",)):
            result = run_cli("launch", "--cpu", *dry_run, "--num_processes", processes, "--log_dir",
                             log_dir, "train.py", cwd=tmp_path)
            line = one_line_error(result)
            assert f"--log_dir {log_dir}" in line and "not a folder" in line, line
            assert result.stdout == ""


def test_a_script_named_like_an_option_runs_as_a_file(tmp_path):
    write_script(tmp_path, "-dash.py", "import sys\nprint('ran', sys.argv[1:])\n")
    ran = run_cli("launch", "--cpu", "--", "-dash.py", "--epochs", "1", cwd=tmp_path)
    assert ran.returncode == 0 and "ran ['--epochs', '1']" in ran.stdout, ran.stderr[-2000:]
    for processes in ("1", "2"):
        plan = run_cli("launch", "--cpu", "--dry_run", "--num_processes", processes, "--", "-dash.py",
                       cwd=tmp_path)
        assert plan.returncode == 0 and " ./-dash.py" in plan.stdout, plan.stderr[-2000:]
        assert " -dash.py" not in plan.stdout, plan.stdout
