"""`mpslaunch check` and the check before `launch` under hostile input: a full disk, a removed
working folder, more local modules than the check reads, a notebook, expressions nested too
deeply for Python's parser, Ctrl-C, a FIFO, an unreadable folder, a symlink loop, and kept
findings that must follow the files' content, stay small and survive concurrent launches."""

from __future__ import annotations

import json
import marshal
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import one_line_error, run_cli, small_disk, write_script

from mpslaunch.check import Target, cache, check_sources
from mpslaunch.check.reading import read_sources

CUDA_LINE = "import torch\n\ntorch.ones(1).cuda()\n"


def warnings_of(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    return [line.removeprefix("mpslaunch: warning: ") for line in result.stderr.splitlines()
            if line.startswith("mpslaunch: warning: ")]


def cache_files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*") if path.is_file())


# ---------------------------------------------------------------- the kept findings


@pytest.mark.slow
def test_a_full_disk_leaves_no_temporary_file(tmp_path):
    script = write_script(tmp_path, "train.py", CUDA_LINE)
    with small_disk(tmp_path / "cache", "64k") as disk:
        try:
            (disk / "filler").write_bytes(b"x" * 1_000_000)
        except OSError:
            pass  # the disk is full now
        for _ in range(2):
            result = run_cli("launch", "--dry-run", "--cpu", str(script),
                             env={"MPSLAUNCH_CACHE_DIR": str(disk)})
            assert any(".cuda()" in line for line in warnings_of(result))
        assert [path.name for path in cache_files(disk) if path.name != "filler"] == []


@pytest.mark.slow
def test_kept_findings_follow_the_content_and_a_module_added_later(tmp_path):
    script = write_script(tmp_path, "train.py", "import torch\nimport helpers\n\nx = torch.ones(1).cuda()\n")

    def launch() -> list[str]:
        return [line.split(": ")[0] for line in
                warnings_of(run_cli("launch", "--dry-run", "--cpu", "train.py", cwd=tmp_path))]

    assert launch() == ["train.py:4"]
    # a local module that did not exist at the first launch
    write_script(tmp_path, "helpers.py", "import torch\n\nmodel = torch.nn.Linear(2, 2).cuda()\n")
    assert launch() == ["train.py:4", "helpers.py:3"]
    # the same size and the same modification time, but no cuda any more
    status = script.stat()
    script.write_text("import torch\nimport helpers\n\nx = torch.ones(1).cpu()\n ")
    assert script.stat().st_size == status.st_size
    os.utime(script, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert launch() == ["helpers.py:3"]


@pytest.mark.slow
def test_a_damaged_entry_is_checked_again_and_rewritten(tmp_path, isolated_cache_dir, monkeypatch):
    write_script(tmp_path, "train.py", CUDA_LINE)
    first = warnings_of(run_cli("launch", "--dry-run", "--cpu", "train.py", cwd=tmp_path))
    assert first[0].startswith("train.py:3: .cuda()")

    def nulled(value):  # every field of every kept finding set to null
        if isinstance(value, dict):
            return {name: (None if name in ("file", "line", "message", "fix") else nulled(item))
                    for name, item in value.items()}
        return [nulled(item) for item in value] if isinstance(value, list) else value

    for damage in (nulled, lambda entry: {"findings": "many"}, None):
        for path in cache_files(isolated_cache_dir):
            if damage is None:
                path.write_bytes(b"\x00{not marshal")
            else:
                path.write_bytes(marshal.dumps(damage(marshal.loads(path.read_bytes()))))
        assert warnings_of(run_cli("launch", "--dry-run", "--cpu", "train.py", cwd=tmp_path)) == first
    monkeypatch.chdir(tmp_path)  # where the launches ran
    assert cache.read(Path("train.py"), Target("cpu", 1, "Linux"), isolated_cache_dir) is not None  # rewritten


@pytest.mark.slow
def test_each_script_keeps_its_own_small_entry(tmp_path, isolated_cache_dir):
    many = write_script(tmp_path, "many.py", "import torch\n\n" + "torch.ones(1).cuda()\n" * 3000)
    other = write_script(tmp_path, "other.py", CUDA_LINE)
    lines = warnings_of(run_cli("launch", "--dry-run", "--cpu", str(many)))
    assert lines[-1].startswith("2995 more: mpslaunch check")
    assert sum(path.stat().st_size for path in cache_files(isolated_cache_dir)) < 8_000
    assert warnings_of(run_cli("launch", "--dry-run", "--cpu", str(many))) == lines  # read back

    before = {path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in cache_files(isolated_cache_dir)}
    warnings_of(run_cli("launch", "--dry-run", "--cpu", str(other)))
    # another script's launch writes its own entry and leaves this one as it was
    assert all((path.stat().st_ino, path.stat().st_mtime_ns) == stamp for path, stamp in before.items())


@pytest.mark.slow
def test_concurrent_launches_keep_every_script_s_findings(tmp_path, isolated_cache_dir):
    scripts = [write_script(tmp_path, f"train_{n}.py", CUDA_LINE) for n in range(4)]
    env = {**os.environ, "MPSLAUNCH_CACHE_DIR": str(isolated_cache_dir)}
    launches = [subprocess.Popen([sys.executable, "-m", "mpslaunch", "launch", "--dry-run", "--cpu", str(script)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
                for script in scripts]
    assert [launch.wait(timeout=120) for launch in launches] == [0] * 4
    target = Target("cpu", 1, "Linux")
    kept = [cache.read(script, target, isolated_cache_dir) for script in scripts]
    assert all(entry is not None for entry in kept)


# ---------------------------------------------------------------- finding and reading the script


@pytest.mark.slow
def test_a_removed_working_folder_works_as_python_does(tmp_path):
    script = write_script(tmp_path, "ok.py", "print('ok')\n")
    gone = tmp_path / "gone"

    def from_removed_folder(*args: str) -> subprocess.CompletedProcess:
        gone.mkdir()
        # the child enters the folder, then removes it before it starts mpslaunch
        return run_cli(*args, cwd=gone, preexec_fn=lambda: os.rmdir(gone), timeout=180)

    launched = from_removed_folder("launch", "--cpu", str(script))
    assert launched.returncode == 0 and launched.stdout == "ok\n", launched.stderr[-2000:]
    assert "Traceback" not in launched.stderr
    module = from_removed_folder("launch", "--cpu", "-m", "this")
    assert module.returncode == 0 and "Beautiful is better" in module.stdout, module.stderr[-2000:]
    checked = from_removed_folder("check", str(script))
    assert checked.returncode == 0 and checked.stdout.startswith("nothing found"), checked.stderr
    for command in ("launch", "check"):
        line = one_line_error(from_removed_folder(command, "nope.py"))
        assert "no script at nope.py" in line and "the current folder was removed" in line


@pytest.mark.slow
def test_a_fifo_is_refused_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "x.py")
    for args in (("check", "x.py"), ("launch", "--dry-run", "x.py"), ("launch", "--dry-run", "--no_check", "x.py")):
        line = one_line_error(run_cli(*args, cwd=tmp_path, timeout=60))
        assert "x.py is a named pipe (FIFO), not a file" in line, line


def unprivileged() -> list[str]:
    """A command prefix that makes this process's permissions count, as they do for a user:
    root keeps its uid (so the project's Python stays readable) but loses the right to bypass
    file permissions."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root reads every folder, and setpriv (to drop that right) is not installed")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.mark.slow
def test_an_unreadable_folder_and_a_symlink_loop_say_why(tmp_path):
    prefix = unprivileged()
    locked = tmp_path / "locked"
    locked.mkdir()
    write_script(locked, "train.py", CUDA_LINE)
    (tmp_path / "loop.py").symlink_to("loop.py")
    locked.chmod(0)
    try:
        for command in (["check"], ["launch", "--dry-run"]):
            ran = subprocess.run([*prefix, sys.executable, "-m", "mpslaunch", *command, "locked/train.py"],
                                 capture_output=True, text=True, cwd=tmp_path, timeout=120)
            line = one_line_error(ran)
            assert "cannot read locked/train.py" in line and "permission denied" in line, line
            assert f"{locked} cannot be searched" in line, line
            loop = one_line_error(subprocess.run([sys.executable, "-m", "mpslaunch", *command, "loop.py"],
                                                 capture_output=True, text=True, cwd=tmp_path, timeout=120))
            assert "cannot read loop.py" in loop and "symbolic link" in loop, loop
    finally:
        locked.chmod(0o755)


# ---------------------------------------------------------------- what check did not read


@pytest.mark.slow
def test_modules_past_the_limit_are_named_as_not_read(tmp_path):
    imports = "".join(f"import mod{n}\n" for n in range(100))
    write_script(tmp_path, "train.py", "import torch\n" + imports)
    for n in range(100):
        write_script(tmp_path, f"mod{n}.py", CUDA_LINE if n == 80 else "import torch\n")
    result = run_cli("check", "--device", "mps", "train.py", cwd=tmp_path)
    lines = result.stdout.splitlines()
    assert "not checked: mod80.py: not read" in "\n".join(lines), result.stdout[-3000:]
    assert lines[-1].startswith("nothing found") and "41 not checked" in lines[-1], lines[-1]
    report = json.loads(run_cli("check", "--device", "mps", "--json", "train.py", cwd=tmp_path).stdout)
    assert len(report["files"]) == 60
    assert sum(line.startswith("mod80.py") for line in report["skipped"]) == 1


def notebook(cells: list[tuple[str, str]], **extra) -> str:
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": extra.get("metadata", {}),
                       "cells": [{"cell_type": kind, "metadata": {}, "source": source.splitlines(True),
                                  **({"outputs": [], "execution_count": None} if kind == "code" else {})}
                                 for kind, source in cells]})


@pytest.mark.slow
def test_a_notebook_s_code_cells_are_read_and_named(tmp_path):
    write_script(tmp_path, "train.ipynb", notebook([
        ("markdown", "# Training\nOn the GPU.\n"),
        ("code", "%matplotlib inline\nimport torch\n"),
        ("code", "!pip list\nmodel = torch.nn.Linear(2, 2)\nmodel.cuda()\n"),
        ("code", "%%bash\nnvidia-smi\n"),
        ("code", "x = (\n"),
        ("code", "loader = torch.utils.data.DataLoader(range(8), num_workers=2)\n"),
    ]))
    result = run_cli("check", "--device", "mps", "train.ipynb", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("train.ipynb:cell_3:3: .cuda() fails on a Mac"), lines
    assert "not checked: train.ipynb:cell_4: a %%bash cell" in result.stdout
    assert "not checked: train.ipynb:cell_5:1: syntax error" in result.stdout
    # a kernel's spawned workers do not run the notebook again, as they run a script
    assert "main guard" not in result.stdout and lines[-1].startswith("1 finding for mps")
    report = json.loads(run_cli("check", "--device", "mps", "--json", "train.ipynb", cwd=tmp_path).stdout)
    assert (report["findings"][0]["file"], report["findings"][0]["line"]) == ("train.ipynb:cell_3", 3)


@pytest.mark.slow
def test_a_notebook_that_cannot_be_read_and_launching_one_are_one_line(tmp_path):
    write_script(tmp_path, "broken.ipynb", '{"cells": [')
    assert "not a Jupyter notebook" in one_line_error(run_cli("check", "broken.ipynb", cwd=tmp_path))
    write_script(tmp_path, "r.ipynb", notebook([("code", "x <- 1\n")],
                                               metadata={"kernelspec": {"language": "R", "name": "ir"}}))
    assert "a notebook in R" in one_line_error(run_cli("check", "r.ipynb", cwd=tmp_path))
    write_script(tmp_path, "train.ipynb", notebook([("code", "print(1)\n")]))
    line = one_line_error(run_cli("launch", "--dry-run", "train.ipynb", cwd=tmp_path))
    assert "jupyter nbconvert --to script train.ipynb" in line


# ---------------------------------------------------------------- nesting and Ctrl-C


DEEP = {  # inside a function never called: a Python that parses them never computes them
    "3000 powers": " ** ".join(["2"] * 3000),
    "3000 lambdas": "lambda: " * 3000 + "1",
    "20000 minus signs": "-" * 20000 + "1",
}


@pytest.mark.slow
@pytest.mark.parametrize("deep", DEEP.values(), ids=DEEP.keys())
def test_too_deep_for_the_parser_is_one_line_and_launch_still_runs_it(tmp_path, deep):
    script = write_script(tmp_path, "train.py", f"import torch\n\ndef never():\n    return {deep}\n")
    assert "nests expressions too deeply" in one_line_error(run_cli("check", "train.py", cwd=tmp_path))
    ran = run_cli("launch", "--cpu", "train.py", cwd=tmp_path)
    lines = ran.stderr.splitlines()
    assert lines[0].startswith("mpslaunch: warning: train.py was not checked: it nests expressions too deeply")
    assert ran.returncode == 1 and "MemoryError" in ran.stderr  # Python's own message
    assert "Traceback" not in ran.stderr and script.exists()


@pytest.mark.slow
def test_too_deep_for_the_check_but_not_for_python_runs_with_one_warning(tmp_path):
    write_script(tmp_path, "train.py", "import torch\nf = " + "lambda: " * 2500 + "1\nprint('ran')\n")
    ran = run_cli("launch", "--cpu", "train.py", cwd=tmp_path, timeout=180)
    assert ran.returncode == 0 and ran.stdout == "ran\n", ran.stderr[-2000:]
    assert [line for line in ran.stderr.splitlines() if "warning" in line] == [
        "mpslaunch: warning: train.py was not checked: it nests expressions too deeply for the "
        "check to read; check it by hand"]


# The CLI, with a real SIGINT sent to itself as a chosen function is called (as a Ctrl-C lands):
# as the check starts reading, and as the kept findings' temporary file replaces the entry.
INTERRUPTED = """
import importlib, os, signal, sys
from mpslaunch import commands as cli
where = importlib.import_module("{module}")
real = where.{function}
def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)
where.{function} = interrupted
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("module, function", [("mpslaunch.check.reading", "read_sources"), ("os", "replace")])
def test_ctrl_c_during_the_check_before_a_launch(tmp_path, isolated_cache_dir, module, function):
    write_script(tmp_path, "train.py", CUDA_LINE + "print('ran')\n")
    ran = subprocess.run([sys.executable, "-c", INTERRUPTED.format(module=module, function=function),
                          "launch", "--cpu", "train.py"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120, env={**os.environ, "MPSLAUNCH_CACHE_DIR": str(isolated_cache_dir)})
    assert ran.returncode == 130 and ran.stdout == "", ran.stderr[-2000:]
    assert ran.stderr.splitlines() == ["mpslaunch: error: interrupted while checking train.py; nothing ran"]
    assert [path for path in cache_files(isolated_cache_dir) if path.name.endswith(".tmp")] == []
    checked = subprocess.run([sys.executable, "-c", INTERRUPTED.format(module=module, function=function),
                              "check", "train.py"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    if module != "os":  # check keeps nothing
        assert checked.returncode == 130 and checked.stdout == "", checked.stderr[-2000:]
        assert checked.stderr.splitlines() == ["mpslaunch: error: interrupted while checking train.py"]


# ---------------------------------------------------------------- unit level


def test_reading_records_what_it_could_not_find(tmp_path):
    script = write_script(tmp_path, "train.py", "import helpers\nfrom data import loaders\n")
    sources = read_sources(script, whole=False)
    absent = {Path(path).name for path in sources.absent}
    assert {"helpers.py", "helpers", "data.py", "data"} <= absent
    assert len(sources.files[0].digest) == 32


def test_kept_findings_round_trip_and_refuse_any_other_shape(tmp_path):
    write_script(tmp_path, "helpers.py", "import torch\n\nnet = torch.nn.Linear(2, 2).cuda()\n")
    script = write_script(tmp_path, "train.py", "import helpers\nimport torch\n" + "torch.ones(1).cuda()\n" * 8)
    target, folder = Target("cpu", 1, "Linux"), tmp_path / "cache"
    sources = read_sources(script, whole=False)
    saved = cache.save(script, target, sources.read, sources.absent, check_sources(sources, target), folder)
    assert (len(saved.findings), saved.count) == (5, 9)
    assert cache.read(script, target, folder) == saved
    assert cache.read(script, Target("mps", 1, "Darwin"), folder) is None  # another plan
    [entry] = (folder / cache.ENTRIES).iterdir()
    kept = marshal.loads(entry.read_bytes())
    for damaged in ({**kept, "count": 2}, {**kept, "count": True}, {**kept, "read": [["x"]]},
                    {**kept, "absent": [None]}, {**kept, "findings": [{**kept["findings"][0], "line": "3"}]},
                    {**kept, "key": "another"}, [kept]):
        entry.write_bytes(marshal.dumps(damaged))
        assert cache.read(script, target, folder) is None, damaged
    entry.write_bytes(marshal.dumps(kept)[:40])  # cut short
    assert cache.read(script, target, folder) is None
    entry.write_bytes(marshal.dumps(kept))
    (tmp_path / "helpers.py").write_text("import torch\n\nnet = torch.nn.Linear(2, 2).cpu()\n")
    assert cache.read(script, target, folder) is None  # a module's content changed
