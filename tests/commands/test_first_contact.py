"""A newcomer's first hour: the habits of other launchers (torchrun's `torchrun train.py`), a typo
in a command, the launcher's options given after the script, a hand-written profile in YAML's
own words, and an import over a profile that is already there."""

from __future__ import annotations

import pytest

from helpers import one_line_error, run_cli, write_script
from mpslaunch.settings import profile_files


@pytest.mark.slow
@pytest.mark.parametrize("args, suggested", [
    (["train.py"], "`mpslaunch launch train.py`"),
    (["train.py", "--epochs", "3"], "`mpslaunch launch train.py --epochs 3`"),
    (["--cpu", "train.py"], "`mpslaunch launch --cpu train.py`"),
    (["lauch", "train.py"], "`mpslaunch launch train.py`"),
    (["chek", "train.py"], "`mpslaunch check train.py`"),
    (["conifg"], "`mpslaunch config`"),
])
def test_a_script_or_a_typo_in_place_of_the_command_suggests_the_command(tmp_path, args, suggested):
    write_script(tmp_path, "train.py", "print('trained')\n")
    line = one_line_error(run_cli(*args, cwd=tmp_path))
    assert f"did you mean {suggested}?" in line, line
    assert "invalid choice" not in line


@pytest.mark.slow
def test_an_unknown_command_names_the_commands(tmp_path):
    line = one_line_error(run_cli("frobnicate", cwd=tmp_path))
    assert "unknown command 'frobnicate'" in line and "launch" in line and "config" in line, line


ARGPARSE_SCRIPT = """\
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
print("epochs", parser.parse_args().epochs)
"""


@pytest.mark.slow
@pytest.mark.parametrize("processes", ["1", "2"])
def test_launch_options_after_the_script_get_a_note_when_the_script_refuses_them(tmp_path, processes):
    write_script(tmp_path, "train.py", ARGPARSE_SCRIPT)
    refused = run_cli("launch", "train.py", "--cpu", "--num_processes", processes, cwd=tmp_path)
    assert refused.returncode == 2 and "unrecognized arguments" in refused.stderr, refused.stderr
    notes = [line for line in refused.stderr.splitlines() if line.startswith("mpslaunch: note:")]
    assert len(notes) == 1 and "--cpu and --num_processes" in notes[0], refused.stderr
    assert "went to the script" in notes[0] and "before the script" in notes[0], notes[0]
    ran = run_cli("launch", "--cpu", "--num_processes", processes, "train.py", "--epochs", "2", cwd=tmp_path)
    assert ran.returncode == 0 and "epochs 2" in ran.stdout and "note:" not in ran.stderr, ran.stderr


@pytest.mark.slow
def test_yaml_no_in_a_hand_written_profile_means_no(tmp_path):
    profile = tmp_path / "mine.yaml"
    profile.write_text("device: cpu\nmixed_precision: no\ndynamo_backend: off\n")
    loaded = profile_files.load(profile)
    assert (loaded.mixed_precision, loaded.dynamo_backend) == ("no", "no")
    write_script(tmp_path, "train.py", "print('trained')\n")
    plan = run_cli("launch", "--dry_run", "--config_file", str(profile), "train.py", cwd=tmp_path)
    assert plan.returncode == 0 and "mixed precision: no" in plan.stdout, plan.stderr
    profile.write_text("device: no\n")  # no choice of device is called no: still refused
    line = one_line_error(run_cli("launch", "--dry_run", "--config_file", str(profile), "train.py",
                                  cwd=tmp_path))
    assert "device must be str, not bool False" in line, line


@pytest.mark.slow
def test_an_import_over_an_existing_profile_keeps_the_old_one_beside_it(tmp_path):
    accelerate = tmp_path / "accelerate.yaml"
    accelerate.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\n"
                          "mixed_precision: bf16\nuse_cpu: true\nnum_processes: 1\n")
    config = tmp_path / "config"
    config.mkdir()
    mine = "# tuned by hand\ndevice: cpu\nmixed_precision: fp16\nmps_memory_cap: 0.5\n"
    (config / "default.yaml").write_text(mine)
    result = run_cli("config", "--from_accelerate", str(accelerate), config_dir=config)
    assert result.returncode == 0, result.stderr
    assert (config / "default.yaml.bak").read_text() == mine
    assert f"the previous one is kept as {config / 'default.yaml.bak'}" in result.stdout, result.stdout
    assert "mixed_precision: bf16" in (config / "default.yaml").read_text()
    again = run_cli("config", "--from_accelerate", str(accelerate), config_dir=config)
    assert again.returncode == 0 and (config / "default.yaml.bak").read_text() == mine, again.stdout


@pytest.mark.slow
def test_check_counts_num_processes_as_launch_does(tmp_path, monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # machine 1 of 2, as this machine can describe it
    write_script(tmp_path, "train.py", "import torch\nprint(torch.ones(1))\n")
    two_machines = tmp_path / "two.yaml"
    two_machines.write_text("device: cpu\nnum_machines: 2\nmachine_rank: 1\nmain_process_ip: 10.0.0.1\n")
    plan = run_cli("launch", "--dry_run", "--config_file", str(two_machines), "--num_processes", "2",
                   "train.py", cwd=tmp_path)
    assert f"2 per machine (--num_processes), 2 machines (profile {two_machines})" in plan.stdout, \
        plan.stderr
    checked = run_cli("check", "--config_file", str(two_machines), "--num_processes", "2", "train.py",
                      cwd=tmp_path)
    assert "cpu, 4 processes" in checked.stdout, checked.stdout + checked.stderr
    assert "on this machine, as `launch --num_processes`" in " ".join(run_cli("check", "--help").stdout.split())


def test_messages_spell_options_as_help_shows_them():
    """--help shows --dry_run and --from_accelerate; a message that says --dry-run sends the
    reader looking for an option --help does not list (the dash forms are accepted, not shown)."""
    import ast
    import re

    from helpers import REPO
    from mpslaunch.settings import OPTIONS

    ours = {option.spelling for option in OPTIONS if option.spelling} | {"--from_accelerate"}
    torchruns = REPO / "src" / "mpslaunch" / "run" / "torchrun" / "args.py"  # torchrun's own --log-dir
    found = []
    for path in (REPO / "src" / "mpslaunch").rglob("*.py"):
        if path == torchruns:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found += [(path.name, word) for word in re.findall(r"--[a-z]+(?:-[a-z]+)+", node.value)
                          if word.replace("-", "_").replace("__", "--", 1) in ours]
    # torch.distributed.run's own option, and flags.py's account of the hidden dash form.
    assert set(found) <= {("child.py", "--monitor-interval"), ("flags.py", "--num-processes")}, found


@pytest.mark.slow
def test_a_profile_for_a_mac_can_be_written_from_linux_under_its_own_name(tmp_path):
    mac = tmp_path / "mac.yaml"
    written = run_cli("config", "--default", "--device", "mps", "--mixed_precision", "bf16",
                      "--config_file", str(mac), cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert "device: mps" in mac.read_text() and "mixed_precision: bf16" in mac.read_text()
    assert "on this machine `mpslaunch launch` would refuse: " in written.stdout, written.stdout
    # The default profile is this machine's: one it cannot run is still refused.
    line = one_line_error(run_cli("config", "--default", "--device", "mps", cwd=tmp_path,
                                  config_dir=tmp_path / "config"))
    assert "--device mps asks for mps" in line and "--config_file" in line, line
    assert not (tmp_path / "config" / "default.yaml").exists()


@pytest.mark.slow
def test_a_mistyped_profile_name_suggests_the_profile_that_exists(tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    (config / "asked.yaml").write_text("device: cpu\n")
    write_script(tmp_path, "train.py", "print('trained')\n")
    line = one_line_error(run_cli("launch", "--profile", "asekd", "train.py", cwd=tmp_path,
                                  config_dir=config))
    assert f"no profile at {config / 'asekd.yaml'}; did you mean --profile asked?" in line, line
    assert "(or make this one with `mpslaunch config --profile asekd`)" in line
    line = one_line_error(run_cli("launch", "--profile", "gpu8", "train.py", cwd=tmp_path,
                                  config_dir=config))
    assert line.endswith("make one with `mpslaunch config --profile gpu8`"), line
    line = one_line_error(run_cli("launch", "--config_file", "ask.yml", "train.py", cwd=tmp_path))
    assert line.endswith("make one with `mpslaunch config --config_file ask.yml`"), line


@pytest.mark.slow
def test_a_hand_written_profile_with_two_misspelled_keys_names_both_in_one_line(tmp_path):
    profile = tmp_path / "mine.yaml"
    profile.write_text("devise: cpu\nmixed_precison: bf16\nnum_processes: 1\n")
    write_script(tmp_path, "train.py", "print('trained')\n")
    line = one_line_error(run_cli("launch", "--config_file", str(profile), "train.py", cwd=tmp_path))
    assert ("line 1: unknown key 'devise' (did you mean 'device'?); line 2: unknown key "
            "'mixed_precison' (did you mean 'mixed_precision'?)") in line, line


@pytest.mark.slow
@pytest.mark.parametrize("written, said", [
    ("main_process_port: 8:20", "main_process_port is written 8:20, which YAML reads as the "
     "base-60 number 500; write the number itself"),
    ("max_restarts: 99999999999999999999", "max_restarts must be at most 10,000"),
])
def test_a_number_yaml_reads_otherwise_or_far_too_large_is_refused_in_one_line(tmp_path, written,
                                                                                said):
    profile = tmp_path / "mine.yaml"
    profile.write_text(f"device: cpu\nnum_processes: 2\nrdzv_backend: c10d\n{written}\n")
    write_script(tmp_path, "train.py", "print('trained')\n")
    for dry_run in ((), ("--dry_run",)):
        result = run_cli("launch", *dry_run, "--config_file", str(profile), "train.py", cwd=tmp_path)
        assert said in one_line_error(result) and result.stdout == ""


@pytest.mark.slow
def test_a_mac_profile_written_on_linux_has_the_mac_keys_and_checks_a_script_for_a_mac(tmp_path):
    """`check` reads a script for the plan the profile names; it needs no machine of that kind."""
    mac = tmp_path / "mac.yaml"
    assert run_cli("config", "--default", "--device", "mps", "--config_file", str(mac)).returncode == 0
    written = profile_files.load(mac)
    assert {"mps_fallback:", "mps_memory_cap:", "keep_awake:"} <= set(
        line.split(" ")[0] for line in mac.read_text().splitlines())
    assert written.device == "mps" and written.mps_fallback and written.keep_awake
    write_script(tmp_path, "train.py", "import torch\nx = torch.zeros(1).cuda()\n")
    checked = run_cli("check", "--config_file", str(mac), "train.py", cwd=tmp_path)
    assert checked.returncode == 1, checked.stderr
    assert checked.stdout.startswith("train.py:2: .cuda() fails on a Mac, where torch has no CUDA")
    assert checked.stdout.strip().splitlines()[-1] == "1 finding for mps, 1 process, on macOS"
    two = tmp_path / "two.yaml"
    two.write_text("device: mps\nnum_processes: 2\n")
    line = one_line_error(run_cli("check", "--config_file", str(two), "train.py", cwd=tmp_path))
    assert "asks for mps with 2 processes, but mps runs one process" in line, line
