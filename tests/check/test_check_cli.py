"""`mpslaunch check` and the check `mpslaunch launch` runs first, through the CLI as a user runs
them: exit codes, --json, bad input in one line, the warnings before a run (at most five), and
the ways to turn them off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ON_A_MAC_CLI as ON_A_MAC
from helpers import REPO, run_cli, write_script

pytestmark = pytest.mark.slow  # every test here starts processes

SCRIPTS = Path(__file__).parent / "scripts"
CUDA_FIRST = str(SCRIPTS / "cuda_first.py")


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpslaunch: error: "), result.stderr
    return lines[0]


# ---------------------------------------------------------------- mpslaunch check


def test_findings_exit_1_one_line_each_and_the_plan_last():
    result = run_cli("check", "--device", "mps", "cuda_first.py", cwd=SCRIPTS)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 13 and lines[-1] == "12 findings for mps, 1 process, on macOS"
    assert all(line.split(":")[0] in ("cuda_first.py", "models.py") for line in lines[:-1])
    assert any(line.startswith("cuda_first.py:") and ": .cuda() fails on a Mac" in line for line in lines)


def test_nothing_found_exits_0():
    result = run_cli("check", "--device", "mps", str(REPO / "examples" / "cv_example.py"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "nothing found for mps, 1 process, on macOS in 1 file"


def test_the_plan_launch_would_use_here_by_default():
    # This machine has no GPU: launch plans cpu, one process.
    result = run_cli("check", CUDA_FIRST)
    assert result.returncode == 1
    assert "for cpu, 1 process" in result.stdout.splitlines()[-1]
    several = run_cli("check", "--num_processes", "2", CUDA_FIRST)
    assert "init_process_group(\"nccl\")" in several.stdout and "2 processes" in several.stdout


def test_json_for_tools():
    result = run_cli("check", "--device", "cpu", "--num_processes", "2", "--json", CUDA_FIRST)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["plan"]["device"] == "cpu" and report["plan"]["processes"] == 2
    assert [Path(name).name for name in report["files"]] == ["cuda_first.py", "models.py"]
    assert {finding["rule"] for finding in report["findings"]} == {
        "nccl-cpu", "cuda-device", "load-map-location", "cuda-amp"}
    first = report["findings"][0]
    assert set(first) == {"file", "line", "rule", "message", "fix", "breaks", "fact"}


def test_a_missing_script_a_folder_and_an_impossible_plan_are_one_line_errors(tmp_path):
    assert "no script at" in one_error_line(run_cli("check", str(tmp_path / "train.py")))
    assert "is a folder" in one_error_line(run_cli("check", str(tmp_path)))
    assert "mps runs one process" in one_error_line(
        run_cli("check", "--device", "mps", "--num_processes", "2", CUDA_FIRST))


def test_bytecode_and_a_zip_archive_are_named_for_what_they_are(tmp_path):
    """python runs both; the check reads source, and says so rather than "Python cannot read it"."""
    import py_compile
    import zipfile

    script = write_script(tmp_path, "train.py", "import torch\nx = torch.zeros(1).cuda()\n")
    py_compile.compile(str(script), cfile=str(tmp_path / "train.pyc"))
    (tmp_path / "renamed").write_bytes((tmp_path / "train.pyc").read_bytes())
    for name in ("train.pyc", "renamed"):
        line = one_error_line(run_cli("check", name, cwd=tmp_path))
        assert line == (f"mpslaunch: error: {name} is compiled Python (bytecode): python runs it, "
                        "but the check reads source; check the .py file it was compiled from")
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
        archive.write(script, "__main__.py")
    line = one_error_line(run_cli("check", "app.zip", cwd=tmp_path))
    assert "app.zip is a zip archive: python runs the __main__.py in it" in line


def test_a_folder_with_a_main_is_checked_as_python_runs_it(tmp_path):
    app = tmp_path / "app"
    app.mkdir()
    write_script(app, "__main__.py", "import torch\nfrom models import build\n")
    write_script(app, "models.py", "import torch\ndef build():\n    return torch.zeros(1).cuda()\n")
    result = run_cli("check", "--device", "cpu", "app", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("app/models.py:3: .cuda() puts work on cuda"), result.stdout
    assert result.stdout.strip().endswith("1 finding for cpu, 1 process, with Python "
                                          f"{sys.version_info[0]}.{sys.version_info[1]} on Linux")
    launched = run_cli("launch", "--cpu", "--dry_run", "app", cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr
    assert launched.stderr.startswith("mpslaunch: warning: app/models.py:3: .cuda() puts work on cuda")


def test_a_syntax_error_is_one_line_with_its_line_number(tmp_path):
    script = write_script(tmp_path, "train.py", "import torch\n\ndef main(:\n    pass\n")
    line = one_error_line(run_cli("check", "train.py", cwd=tmp_path))
    assert line.startswith("mpslaunch: error: train.py:3: syntax error")


def test_a_file_that_is_not_utf8_is_one_line(tmp_path):
    (tmp_path / "train.py").write_bytes(b"import torch\nx = '\xff\xfe'\n")
    line = one_error_line(run_cli("check", "train.py", cwd=tmp_path))
    assert "train.py:2: not utf-8 text (byte 0xff)" in line
    # a coding line is honoured, as Python honours it
    (tmp_path / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\nname = '\xe9'\n")
    assert run_cli("check", "--device", "mps", "latin.py", cwd=tmp_path).returncode == 0


def test_a_huge_file_is_refused_quickly_and_deep_nesting_is_one_line(tmp_path):
    huge = tmp_path / "huge.py"
    huge.write_text("x = 1\n" * 400_000)  # 2.4 MB
    assert "too big to check" in one_error_line(run_cli("check", str(huge), timeout=30))
    deep = write_script(tmp_path, "deep.py", "x = " + " + ".join(["1"] * 3000) + "\n")
    one_error_line(run_cli("check", "--device", "mps", str(deep)))


# ---------------------------------------------------------------- the check launch runs first


def test_launch_shows_five_findings_and_how_to_see_the_rest():
    result = run_cli("launch", "--dry-run", "--cpu", "--num_processes", "2", CUDA_FIRST)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("mpslaunch: warning: ")]
    assert len(warnings) == 6
    assert "init_process_group(\"nccl\")" in warnings[0]  # what stops the run comes first
    assert warnings[-1] == (f"mpslaunch: warning: 3 more: mpslaunch check --device cpu "
                            f"--num_processes 2 {CUDA_FIRST}")
    assert result.stdout.startswith("device:          cpu")


def test_launch_warns_then_runs_the_script_anyway(tmp_path):
    script = write_script(tmp_path, "train.py", (
        "import sys\nimport torch\n"
        "if len(sys.argv) > 3:\n    torch.load(sys.argv[3])\n"
        "print('trained', torch.ones(2).sum().item())\n"))
    result = run_cli("launch", "--cpu", "train.py", "a", cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "trained 2.0"
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == ["mpslaunch: warning: train.py:4: torch.load without map_location: a "
                        "checkpoint saved from cuda tensors fails to load without an NVIDIA GPU "
                        "(\"Attempting to deserialize object on a CUDA device\"); write "
                        "map_location=\"cpu\" (then move the model to the device)"]
    assert result.stderr.index("warning") < result.stderr.index("mpslaunch: cpu")  # before the summary


def test_no_check_the_profile_key_and_quiet_turn_it_off(tmp_path):
    quiet_profile = write_script(tmp_path, "profile.yaml", "version: 1\ncheck: false\n")
    for options in (["--no_check"], ["--no-check"], ["--quiet"], ["--config_file", str(quiet_profile)]):
        result = run_cli("launch", "--dry-run", "--cpu", *options, CUDA_FIRST)
        assert result.returncode == 0, result.stderr
        assert "warning" not in result.stderr, options
    bad = write_script(tmp_path, "bad.yaml", "version: 1\ncheck: maybe\n")
    assert "check" in one_error_line(run_cli("launch", "--dry-run", "--config_file", str(bad), CUDA_FIRST))


def test_launch_leaves_a_broken_script_and_modules_to_python(tmp_path):
    write_script(tmp_path, "train.py", "def main(:\n")
    result = run_cli("launch", "--cpu", "train.py", cwd=tmp_path)
    assert result.returncode == 1 and "SyntaxError" in result.stderr  # Python's own message
    assert "mpslaunch: warning" not in result.stderr and "mpslaunch: error" not in result.stderr
    write_script(tmp_path, "mod.py", "import torch\ntorch.ones(1).cuda()\n")
    module = run_cli("launch", "--dry-run", "--cpu", "-m", "mod", cwd=tmp_path)
    assert module.returncode == 0 and "warning" not in module.stderr




def test_launch_on_a_mac_warns_about_spawned_workers_even_on_cpu():
    script = str(SCRIPTS / "tutorial_unguarded.py")
    result = subprocess.run([sys.executable, "-c", ON_A_MAC, "launch", "--dry-run", "--cpu", script],
                            capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert result.returncode == 0, result.stderr
    assert "workers (num_workers=2) start by spawn on macOS" in result.stderr
    assert "workers" not in run_cli("launch", "--dry-run", "--cpu", script).stderr  # fork on Linux


def test_launch_keeps_the_findings_until_a_file_changes(tmp_path, isolated_cache_dir):
    write_script(tmp_path, "helpers.py", "import torch\n\n\ndef make():\n    return torch.nn.Linear(2, 2)\n")
    write_script(tmp_path, "train.py", "import torch\nfrom helpers import make\n\nmake().cuda()\n")

    def warnings() -> list[str]:
        result = run_cli("launch", "--dry-run", "--cpu", "train.py", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return [line.split(": ", 2)[2].split(":")[0:2] for line in result.stderr.splitlines()
                if line.startswith("mpslaunch: warning: ")]

    assert warnings() == [["train.py", "4"]]
    [entry] = (isolated_cache_dir / "script-checks").iterdir()  # one small file per script and plan
    assert b"train.py" in entry.read_bytes()
    assert warnings() == [["train.py", "4"]]  # read back
    write_script(tmp_path, "helpers.py", "import torch\n\n\ndef make():\n    return torch.nn.Linear(2, 2).cuda()\n")
    assert warnings() == [["train.py", "4"], ["helpers.py", "5"]]  # a local module changed
    entry.write_bytes(b"{not marshal")
    assert warnings() == [["train.py", "4"], ["helpers.py", "5"]]  # a damaged cache: checked again
