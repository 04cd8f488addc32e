"""Several processes without --log_dir write to a temporary folder: removed after a run that
ended well, kept after one that failed, and only the newest few failed runs' folders are kept."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from helpers import run_cli, write_script
from mpslaunch.run import logdir

FAILS = "import os, sys\nprint('rank', os.environ['RANK'], 'fails')\nsys.exit(3)\n"
ENDS_WELL = "import os\nprint('rank', os.environ['RANK'], 'done')\nos._exit(0)\n"


def logs_in(folder: Path) -> list[Path]:
    return sorted(folder.glob(logdir.TEMPORARY_PREFIX + "*"))


def failed_run_folder(folder: Path, age: float) -> Path:
    path = Path(tempfile.mkdtemp(prefix=logdir.TEMPORARY_PREFIX, dir=folder))
    (path / logdir.FAILED_MARK).touch()
    os.utime(path / logdir.FAILED_MARK, (age, age))
    return path


def test_only_the_newest_failed_runs_folders_are_kept_and_never_a_running_one(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old = [failed_run_folder(tmp_path, 1_000_000 + age) for age in range(logdir.KEPT_FAILED + 2)]
    running = Path(tempfile.mkdtemp(prefix=logdir.TEMPORARY_PREFIX, dir=tmp_path))
    os.utime(running, (1, 1))
    newest = logdir.temporary_log_dir()
    logdir.keep_failed(newest)
    kept = set(logs_in(tmp_path))
    assert kept == {running, Path(newest), *old[3:]}


@pytest.mark.slow
def test_a_failed_run_keeps_its_folder_in_tmpdir_and_a_run_that_ends_well_leaves_none(tmp_path):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    earlier = [failed_run_folder(temporary, 1_000_000 + age) for age in range(logdir.KEPT_FAILED)]
    env = {"TMPDIR": str(temporary)}
    script = write_script(tmp_path, "ends_well.py", ENDS_WELL)
    ended = run_cli("launch", "--cpu", "-q", "--num_processes", "2", str(script), env=env)
    assert ended.returncode == 0, ended.stderr[-2000:]
    assert logs_in(temporary) == sorted(earlier)
    script = write_script(tmp_path, "fails.py", FAILS)
    failed = run_cli("launch", "--cpu", "-q", "--num_processes", "2", str(script), env=env)
    assert failed.returncode == 3, failed.stderr[-2000:]
    kept = logs_in(temporary)
    assert len(kept) == logdir.KEPT_FAILED and earlier[0] not in kept
    new = set(kept) - set(earlier)
    assert len(new) == 1 and list(new.pop().rglob("stdout.log"))
