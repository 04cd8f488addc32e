"""Through the command line: a refusal names where the value came from (a flag, a profile file,
an Accelerate config file), and --dry_run says where each value that matters came from."""

from __future__ import annotations

import pytest

from helpers import one_line_error, run_cli, write_script

pytestmark = pytest.mark.slow  # every test here starts processes


def test_a_refused_value_is_named_with_where_it_came_from(tmp_path):
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    profile = tmp_path / "fp16.yaml"
    profile.write_text("device: cpu\nmixed_precision: fp16\n")
    accelerate = tmp_path / "acc.yaml"
    accelerate.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: NO\n"
                          "mixed_precision: fp16\nuse_cpu: true\n")
    why = "asks for fp16, but fp16 mixed precision does not run on cpu"
    from_file = one_line_error(run_cli("launch", "--config_file", str(profile), str(script)))
    assert f"error: mixed_precision: fp16 in {profile} {why}" in from_file
    from_accelerate = one_line_error(run_cli("launch", "--config_file", str(accelerate), str(script)))
    assert f"error: mixed_precision: fp16 from the Accelerate config {accelerate} {why}" \
        in from_accelerate
    flag = one_line_error(run_cli("launch", "--cpu", "--mixed_precision", "fp16", str(script)))
    assert f"error: --mixed_precision fp16 {why}" in flag
    rank = one_line_error(run_cli("launch", "--config_file", str(profile), "--machine_rank", "1",
                                  str(script)))
    assert "error: --machine_rank 1 must be below num_machines 1 (default)" in rank
    assert not (tmp_path / "train.py.ran").exists()


def test_a_device_the_machine_lacks_is_named_with_its_file(tmp_path):
    script = write_script(tmp_path, "train.py", "")
    profile = tmp_path / "mac.yaml"
    profile.write_text("device: mps\n")
    message = one_line_error(run_cli("launch", "--config_file", str(profile), str(script)))
    assert f"error: device: mps in {profile} asks for mps, but mps needs a Mac" in message


def test_the_dry_run_says_where_each_value_came_from(tmp_path):
    script = write_script(tmp_path, "train.py", "")
    profile = tmp_path / "p.yaml"
    profile.write_text("device: cpu\nmixed_precision: bf16\nnum_machines: 2\n"
                       "main_process_ip: 10.0.0.1\n")
    done = run_cli("launch", "--dry_run", "--config_file", str(profile), "--num_processes", "2",
                   "--machine_rank", "1", "--rdzv_timeout", "60", str(script),
                   env={"GLOO_SOCKET_IFNAME": "lo"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:8] == [
        f"device:          cpu (profile {profile})",
        "reason:          cpu: asked for by the profile",
        f"mixed precision: bf16 (profile {profile})",
        f"processes:       2 per machine (--num_processes), 2 machines (profile {profile})",
        "machine rank:    1 (--machine_rank)",
        f"main address:    10.0.0.1 (profile {profile}), port 29500 (default)",
        "rendezvous:      static (default), the machines wait 60 s at most (--rdzv_timeout)",
        "engine:          torchrun",
    ]
    one = run_cli("launch", "--dry_run", "--cpu", str(script))
    assert one.stdout.splitlines()[:4] == [
        "device:          cpu (--cpu)", "reason:          cpu: asked for by --cpu",
        "mixed precision: no (default)", "processes:       1 per machine (default), 1 machine (default)"]
