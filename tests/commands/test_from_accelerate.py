"""Accelerate config files through the CLI: launch --config_file, config --from-accelerate, and
where env and config show mention Accelerate's default config. Files come from Accelerate's writers."""

from __future__ import annotations

import argparse
import json
import sys

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from helpers import MACHINES, basic_config, cluster_config, run_cli, write_script
from mpslaunch import commands as cli, machine as machine_probe
from mpslaunch.settings import profile_files
from mpslaunch.commands import config as configure
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import Profile

REPORT = """
import json, os
print(json.dumps({k: os.environ[k] for k in os.environ if k.startswith(("MPSLAUNCH_", "ACCELERATE_"))}))
"""


@pytest.mark.slow
def test_launch_reads_an_accelerate_file_and_says_so(tmp_path, monkeypatch):
    path = basic_config(tmp_path, "bf16", monkeypatch)
    script = write_script(tmp_path, "report.py", REPORT)
    done = run_cli("launch", "--config_file", str(path), str(script))
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)
    assert (env["MPSLAUNCH_DEVICE"], env["ACCELERATE_MIXED_PRECISION"]) == ("cpu", "bf16")
    notes = [line for line in done.stderr.splitlines() if "note" in line]
    assert notes == [f"mpslaunch: note: {path} was read as an Accelerate config file"]


@pytest.mark.slow
def test_launch_refuses_what_cannot_map_in_one_line(tmp_path):
    path = cluster_config(tmp_path / "ds.yaml", "DEEPSPEED", deepspeed_config={"zero_stage": 3})
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    done = run_cli("launch", "--config_file", str(path), str(script))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "distributed_type DEEPSPEED cannot be translated" in done.stderr
    assert not (tmp_path / "train.py.ran").exists()


def test_launch_on_a_mac_explains_the_unasked_use_cpu(tmp_path, monkeypatch, capsys):
    path = basic_config(tmp_path, "no", monkeypatch)
    on_a_mac(monkeypatch)
    script = write_script(tmp_path, "train.py", "")
    assert cli.main(["launch", "--dry-run", "--config_file", str(path), str(script)]) == 0
    out, err = capsys.readouterr()
    assert "device:          cpu" in out
    assert "writes on every Mac without asking" in err and "--device mps" in err
    assert cli.main(["launch", "--dry-run", "--device", "mps", "--config_file", str(path), str(script)]) == 0
    assert "device:          mps" in capsys.readouterr().out


@pytest.mark.slow
def test_config_from_accelerate_writes_and_shows_the_profile(tmp_path):
    path = cluster_config(tmp_path / "acc.json", "MULTI_CPU", as_json=True, num_processes=4,
                          mixed_precision="bf16")
    done = run_cli("config", "--from-accelerate", str(path), "--profile", "imported",
                   env={"MPSLAUNCH_CONFIG_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert profile_files.load(tmp_path / "imported.yaml") == Profile(device="cpu", mixed_precision="bf16",
                                                                num_processes=4)
    assert f"Read {path} as an Accelerate config file." in done.stdout
    assert "num_processes: 4" in done.stdout and "precision bf16; 4 processes" in done.stdout


@pytest.mark.slow
def test_accelerates_default_config_is_named_and_imported(tmp_path):
    env = {"MPSLAUNCH_CONFIG_DIR": str(tmp_path / "mine"), "HF_HOME": str(tmp_path / "hf")}
    (tmp_path / "hf" / "accelerate").mkdir(parents=True)
    assert "Accelerate" not in run_cli("config", "show", env=env).stdout
    missing = run_cli("config", "--from-accelerate", env=env)
    assert missing.returncode == 2 and "no Accelerate config file at" in missing.stderr
    cluster_config(tmp_path / "hf" / "accelerate" / "default_config.yaml", "MULTI_CPU", num_processes=2,
                   mixed_precision="bf16")
    shown = run_cli("config", "show", env=env).stderr
    assert "mpslaunch: note: Accelerate's default config" in shown and "does not use it unless given" in shown
    assert "mpslaunch config --from_accelerate" in shown
    report = run_cli("env", "--timeout", "60", env=env).stdout
    assert "- Accelerate default config: " in report and "does not use it unless given" in report
    assert run_cli("config", "--from-accelerate", env=env).returncode == 0
    assert profile_files.load(tmp_path / "mine" / "default.yaml").num_processes == 2


def on_a_mac(monkeypatch):
    monkeypatch.setattr(machine_probe, "probe", lambda: MACHINES["m2_macos15"])


def import_args(source, path, default=False) -> argparse.Namespace:
    """`mpslaunch config --from_accelerate SOURCE --config_file PATH [--default]`."""
    return argparse.Namespace(action=None, default=default, profile=None, config_file=str(path),
                              from_accelerate=str(source), device=None, mixed_precision=None,
                              num_processes=None)


def test_on_a_mac_default_keeps_mps_and_says_so(tmp_path, monkeypatch, capsys):
    source = basic_config(tmp_path, "bf16", monkeypatch)
    on_a_mac(monkeypatch)
    assert configure.main(import_args(source, tmp_path / "p.yaml", default=True)) == 0
    assert profile_files.load(tmp_path / "p.yaml") == Profile(device="auto", mixed_precision="bf16", num_processes=1)
    out, err = capsys.readouterr()
    assert "without asking" in err and "keeps the Mac's GPU" in err and "device auto -> mps" in out


def test_on_a_mac_without_a_terminal_or_default_nothing_is_written(tmp_path, monkeypatch):
    source = basic_config(tmp_path, "no", monkeypatch)
    on_a_mac(monkeypatch)
    args = import_args(source, tmp_path / "p.yaml")
    with pytest.raises(MpslaunchError, match="add --default to keep mps, or --device cpu"):
        configure.main(args)
    assert not (tmp_path / "p.yaml").exists()
    args.device = "cpu"  # said outright: no question
    assert configure.main(args) == 0 and profile_files.load(tmp_path / "p.yaml").device == "cpu"


class Terminal:
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("keys, device", [("\r", "auto"), ("n", "cpu")], ids=["keep-mps", "keep-cpu"])
def test_on_a_mac_the_question_decides(tmp_path, monkeypatch, capsys, keys, device):
    source = basic_config(tmp_path, "no", monkeypatch)
    on_a_mac(monkeypatch)
    monkeypatch.setattr(sys, "stdin", Terminal())
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        with create_app_session(input=pipe, output=DummyOutput()):
            assert configure.main(import_args(source, tmp_path / "p.yaml")) == 0
    assert profile_files.load(tmp_path / "p.yaml").device == device
