"""End to end through `python -m mpslaunch launch`: real child processes, real Accelerate, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import file_line, one_line_error, run_cli, wait_for, write_script
from mpslaunch.settings import profile_files
from mpslaunch.settings import Profile

pytestmark = pytest.mark.slow  # every test here starts processes

REPORT_ENV = """
import json, os, sys
keys = [k for k in os.environ if k.startswith(("MPSLAUNCH_", "ACCELERATE_", "PYTORCH_"))]
print(json.dumps({"argv": sys.argv[1:], "env": {k: os.environ[k] for k in keys}}))
"""

WAIT_FOR_SIGNAL = """
import os, signal, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
def record(signum, frame):
    (folder / "got").write_text(signal.Signals(signum).name + "\\n")
    sys.exit(int(sys.argv[2]))
if sys.argv[2] != "default":
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1"):
        signal.signal(getattr(signal, name), record)
(folder / "ready").write_text(f"{os.getpid()}\\n")
time.sleep(60)
"""


def start_launcher(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mpslaunch", "launch", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


# ---------------------------------------------------------------- what the child receives

def test_accelerate_script_follows_cpu_plan(tmp_path):
    script = write_script(tmp_path, "acc.py", """
from accelerate import Accelerator
accelerator = Accelerator()
print("DEVICE", accelerator.device.type, accelerator.distributed_type, accelerator.num_processes,
      accelerator.mixed_precision)
""")
    result = run_cli("launch", "--cpu", "--mixed_precision", "bf16", str(script))
    assert result.returncode == 0, result.stderr
    assert "DEVICE cpu DistributedType.NO 1 bf16" in result.stdout
    assert "mpslaunch: cpu: asked for by --cpu; precision bf16; 1 process" in result.stderr


def test_script_arguments_pass_through_untouched(tmp_path):
    script = write_script(tmp_path, "report.py", REPORT_ENV)
    result = run_cli("launch", "--cpu", "-q", str(script), "--cpu", "--num_processes", "9", "--", "x y")
    report = json.loads(result.stdout)
    assert report["argv"] == ["--cpu", "--num_processes", "9", "--", "x y"]
    assert report["env"]["MPSLAUNCH_DEVICE"] == "cpu"
    assert report["env"]["ACCELERATE_USE_CPU"] == "true"
    assert result.stderr == ""  # --quiet


def test_module_target(tmp_path):
    write_script(tmp_path, "mymod.py", REPORT_ENV)
    result = run_cli("launch", "--cpu", "-q", "-m", "mymod", "a", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["argv"] == ["a"]


def test_default_profile_is_used_and_flags_beat_it(tmp_path, isolated_config_dir):
    profile_files.save(Profile(device="cpu", mixed_precision="bf16"), isolated_config_dir / "default.yaml")
    script = write_script(tmp_path, "report.py", REPORT_ENV)
    env = json.loads(run_cli("launch", "-q", str(script)).stdout)["env"]
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    env = json.loads(run_cli("launch", "-q", "--mixed_precision", "no", str(script)).stdout)["env"]
    assert env["ACCELERATE_MIXED_PRECISION"] == "no"


def test_named_profile_and_config_file(tmp_path, isolated_config_dir):
    profile_files.save(Profile(device="cpu", mixed_precision="bf16"), isolated_config_dir / "fast.yaml")
    profile_files.save(Profile(device="cpu"), tmp_path / "mine.yaml")
    script = write_script(tmp_path, "report.py", REPORT_ENV)
    named = json.loads(run_cli("launch", "-q", "--profile", "fast", str(script)).stdout)["env"]
    assert named["MPSLAUNCH_MIXED_PRECISION"] == "bf16"
    file_based = json.loads(run_cli("launch", "-q", "--config-file", str(tmp_path / "mine.yaml"), str(script)).stdout)
    assert file_based["env"]["MPSLAUNCH_MIXED_PRECISION"] == "no"


def test_user_environment_passes_through(tmp_path):
    script = write_script(tmp_path, "env.py", "import os; print(os.environ['MY_SETTING'])")
    result = run_cli("launch", "--cpu", "-q", str(script), env={"MY_SETTING": "kept"})
    assert result.stdout.strip() == "kept"


def test_a_user_value_the_plan_overrides_is_named(tmp_path):
    """The plan's value wins (flags > profile > auto-detection; the environment is not an
    input), and the plan line and --dry-run say which of the user's values it replaced."""
    script = write_script(tmp_path, "report.py", REPORT_ENV)
    mine = {"ACCELERATE_MIXED_PRECISION": "fp16"}
    result = run_cli("launch", "--cpu", str(script), env=mine)
    assert json.loads(result.stdout)["env"]["ACCELERATE_MIXED_PRECISION"] == "no"
    plan_line, end_line = result.stderr.strip().splitlines()
    assert plan_line.endswith("; replaced in your environment: ACCELERATE_MIXED_PRECISION=fp16 (now no)")
    assert end_line.startswith("mpslaunch: ended after ")
    dry = run_cli("launch", "--dry-run", "--cpu", "--num_processes", "2", str(script), env=mine)
    assert "  ACCELERATE_MIXED_PRECISION=no   replaced (was fp16)" in dry.stdout.splitlines()
    assert "  ACCELERATE_USE_CPU=true" in dry.stdout.splitlines()  # not the user's: just added


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    script = write_script(tmp_path, "touch.py", f"open({str(marker)!r}, 'w').close()")
    result = run_cli("launch", "--dry-run", "--cpu", str(script), "--epochs", "3")
    assert result.returncode == 0
    assert not marker.exists()
    assert "device:          cpu" in result.stdout
    assert "touch.py --epochs 3" in result.stdout
    assert "ACCELERATE_USE_CPU=true" in result.stdout
    assert "  PYTHONFAULTHANDLER=1" in result.stdout.splitlines()  # a native crash shows a stack


def test_single_process_path_does_not_import_torch(tmp_path):
    script = write_script(tmp_path, "noop.py", "pass")
    probe = ("import sys; from mpslaunch.commands import main; "
             f"code = main(['launch', '--cpu', '-q', {str(script)!r}]); "
             "print('torch' in sys.modules, code)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.stdout.strip() == "False 0", result.stderr


# ---------------------------------------------------------------- exit codes

@pytest.mark.parametrize("body, expected", [
    ("pass", 0),
    ("import sys; sys.exit(3)", 3),
    ("import os; os._exit(42)", 42),
    ("raise ValueError('boom from the script')", 1),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 128 + 9),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", 128 + 11),
])
def test_child_exit_code_passes_through(tmp_path, body, expected):
    script = write_script(tmp_path, "code.py", body)
    result = run_cli("launch", "--cpu", "-q", str(script))
    assert result.returncode == expected
    if "ValueError" in body:  # the user's traceback shows once, the launcher adds none
        assert result.stderr.count("Traceback") == 1
        assert "boom from the script" in result.stderr
        assert "mpslaunch" not in result.stderr


@pytest.mark.parametrize("args, expected", [
    (["launch", "missing.py"], "no script at missing.py"),
    (["launch", "."], "is a folder"),
    (["launch", "-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
    (["launch", "-m", "json.no_such_part"], "no module named 'json.no_such_part'"),
    (["launch", "--bogus", "{script}"], "unrecognized arguments: --bogus"),
    (["launch", "--cpu", "--device", "mps", "{script}"], "contradict"),
    (["launch", "--device", "mps", "{script}"], "mps needs a Mac"),
    (["launch", "--num_processes", "zero", "{script}"], "invalid int value"),
    (["launch", "--num_processes", "0", "{script}"], "--num_processes must be 1 or more"),
    (["launch", "--mixed_precision", "fp16", "--cpu", "{script}"], "bf16 on cpu"),
    (["launch", "--profile", "nope", "{script}"], "no profile at"),
    (["launch", "--profile", "../etc", "{script}"], "plain name"),
    (["launch"], "no script given"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, expected):
    script = write_script(tmp_path, "ok.py", "raise SystemExit('must not run')")
    result = run_cli(*[a.replace("{script}", str(script)) for a in args], cwd=tmp_path)
    assert expected in one_line_error(result)


def app_folder(folder: Path) -> Path:
    """A folder python runs (`python app/`): its __main__.py imports a module beside it."""
    app = folder / "app"
    app.mkdir()
    write_script(app, "helper.py", "WORD = 'ran'\n")
    write_script(app, "__main__.py", "import os, sys\nfrom helper import WORD\n"
                 "print(WORD, os.environ['MPSLAUNCH_DEVICE'], sys.argv[1:])\n")
    return app


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_folder_or_zip_with_a_main_and_bytecode_run_as_python_runs_them(tmp_path, processes):
    import py_compile
    import zipfile

    app = app_folder(tmp_path)
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
        for name in ("__main__.py", "helper.py"):
            archive.write(app / name, name)
    py_compile.compile(str(app / "__main__.py"), cfile=str(tmp_path / "main.pyc"))
    (tmp_path / "helper.py").write_text((app / "helper.py").read_text())  # for the bytecode
    for target in ("app", "app/", "app.zip", "main.pyc"):
        python = subprocess.run([sys.executable, target, "x"], capture_output=True, text=True,
                                cwd=tmp_path, env={**os.environ, "MPSLAUNCH_DEVICE": "cpu"})
        ran = run_cli("launch", "--cpu", "-q", "--num_processes", processes, target, "x",
                      cwd=tmp_path)
        assert ran.returncode == 0 == python.returncode, (target, ran.stderr[-2000:])
        lines = [line.removeprefix("[rank0] ").removeprefix("[rank1] ")
                 for line in ran.stdout.splitlines()]
        assert lines == [python.stdout.strip()] * int(processes) == [f"ran cpu ['x']"] * int(processes)


def test_a_folder_without_a_main_is_refused_saying_what_python_runs(tmp_path):
    (tmp_path / "lib").mkdir()
    line = one_line_error(run_cli("launch", "--cpu", "lib", cwd=tmp_path))
    assert "lib is a folder without a __main__.py (what python runs for a folder)" in line


def test_broken_default_profile_is_one_line(tmp_path, isolated_config_dir):
    (isolated_config_dir / "default.yaml").write_text("device: [cpu\n")
    script = write_script(tmp_path, "ok.py", "pass")
    message = one_line_error(run_cli("launch", str(script)))
    assert "default.yaml" in message and "not valid YAML" in message


# ---------------------------------------------------------------- signals

@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1])
def test_signals_reach_the_child_once_and_its_code_comes_back(tmp_path, signum):
    script = write_script(tmp_path, "wait.py", WAIT_FOR_SIGNAL)
    launcher = start_launcher("--cpu", "-q", str(script), str(tmp_path), "7")
    child_pid = int(file_line(tmp_path / "ready"))
    launcher.send_signal(signum)
    assert launcher.wait(timeout=30) == 7
    assert file_line(tmp_path / "got").strip() == signal.Signals(signum).name
    assert not alive(child_pid)


def test_child_killed_by_forwarded_sigterm_gives_143(tmp_path):
    script = write_script(tmp_path, "wait.py", WAIT_FOR_SIGNAL)
    launcher = start_launcher("--cpu", "-q", str(script), str(tmp_path), "default")
    child_pid = int(file_line(tmp_path / "ready"))
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) == 143
    assert not alive(child_pid)


def test_child_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    script = write_script(tmp_path, "stubborn.py", """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "w").write(f"{os.getpid()}\\n")
time.sleep(120)
""")
    ready = tmp_path / "ready"
    launcher = start_launcher("--cpu", "-q", "--grace_period", "1", str(script), str(ready))
    child_pid = int(file_line(ready))
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) == 143  # stopped by SIGTERM, as on the torchrun path
    assert not alive(child_pid)


def test_nothing_the_child_started_outlives_the_run(tmp_path):
    script = write_script(tmp_path, "spawner.py", """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(str(grandchild.pid))
""")
    pid_file = tmp_path / "grandchild"
    assert run_cli("launch", "--cpu", "-q", str(script), str(pid_file)).returncode == 0
    grandchild = int(pid_file.read_text())
    assert wait_for(lambda: not alive(grandchild), 10)


def test_log_dir_with_one_process_keeps_the_output_in_files_too(tmp_path):
    script = write_script(tmp_path, "talk.py", """
import sys
print("to stdout")
print("to stderr", file=sys.stderr)
sys.exit(3)
""")
    result = run_cli("launch", "--cpu", "--log_dir", str(tmp_path / "logs"), str(script))
    assert result.returncode == 3
    assert result.stdout == "to stdout\n" and "to stderr\n" in result.stderr
    assert f"output also in {tmp_path / 'logs'}" in result.stderr
    [run] = (tmp_path / "logs").iterdir()
    assert (run / "stdout.log").read_text() == "to stdout\n"
    assert (run / "stderr.log").read_text() == "to stderr\n"
