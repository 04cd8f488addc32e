"""`mpslaunch env`: the real torch check on this machine, its failure modes, and the printed block."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mpslaunch.commands import env as envreport
from mpslaunch.settings import profile_files
from mpslaunch.machine import Machine, probe
from mpslaunch.settings import Profile

M2 = Machine(system="Darwin", arch="arm64", macos_version=(14, 5), chip="Apple M2",
             torch_version="2.14.1", cpu_count=8, python=sys.executable)


@pytest.mark.slow
def test_cli_prints_one_fenced_block_without_importing_torch(tmp_path):
    profile_files.save(Profile(mixed_precision="bf16"), tmp_path / "default.yaml")
    code = ("import sys; from mpslaunch.commands import main; code = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'the launcher process imported torch'; sys.exit(code)")
    env = {**os.environ, "MPSLAUNCH_CONFIG_DIR": str(tmp_path), "OMP_NUM_THREADS": "3",
           "MPSLAUNCH_SECRET_TOKEN": "hunter2"}
    done = subprocess.run([sys.executable, "-c", code, "env"], capture_output=True, text=True,
                          env=env, timeout=90)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "```text" and lines[-1] == "```" and lines.count("```") == 1
    text = done.stdout
    for label in ("- mpslaunch: ", "- Python: ", "- torch: ", "- torchvision: ", "- accelerate: ",
                  "- MPS: ", "- CUDA devices (torch): ", "- Launcher would choose: "):
        assert label in text
    assert "    OMP_NUM_THREADS=3" in text and "hunter2" not in text
    assert f"- Profile: {tmp_path / 'default.yaml'}" in text and "    mixed_precision: bf16" in text
    # The real check ran on this machine: no Linux or Windows torch wheel has MPS.
    if sys.platform != "darwin":
        assert "- MPS: not built\n" in text
    if not probe().cuda_devices:
        assert "- CUDA devices (torch): no devices" in text


def test_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MPSLAUNCH_CONFIG_DIR", str(tmp_path))
    monkeypatch.setattr(envreport.machine_probe, "probe", lambda: M2)
    monkeypatch.setattr(envreport, "run_torch_check", lambda python, timeout: {
        "torch": "2.14.1", "mps_built": True, "mps_available": True, "mps_check": "works", "cuda_devices": []})
    args = envreport.argparse.Namespace(json=True, profile=None, config_file=None, timeout=20.0)
    assert envreport.main(args) == 0
    facts = json.loads(capsys.readouterr().out)
    assert (facts["mps"], facts["macos"], facts["chip"]) == ("works", "14.5", "Apple M2")
    assert facts["profile"] == "none: defaults" and facts["profile_path"] is None
    assert facts["launcher_choice"].startswith("mps: Apple M2")
    # The plan's warnings: here the known fault of an M2 with torch 2.14 (plan/known_faults.py).
    assert facts["launcher_warnings"] == [
        "on an M1 or M2 GPU, batched matrix products (bmm, 3-D matmul, einsum) over a reduction "
        "dimension of 32,767 or more can be silently wrong (pytorch/pytorch#195163, open); keep "
        "such products 2-D, or compare their results with the CPU's"]
    text = envreport.as_markdown(facts)
    assert "\n- Launcher would warn: on an M1 or M2 GPU, batched matrix products" in text


# ---------------------------------------------------------------- how the check can go wrong


@pytest.mark.slow
def test_a_check_that_hangs_is_reported_as_timed_out():
    facts = envreport.run_torch_check(sys.executable, timeout=0.5, code="import time; time.sleep(30)")
    assert envreport.mps_status(facts, 0.5).startswith("timed out")


@pytest.mark.slow
def test_a_check_that_crashes_is_reported_with_its_last_words():
    code = "import sys; sys.stderr.write('Metal device lost\\n'); sys.exit(3)"
    facts = envreport.run_torch_check(sys.executable, timeout=10, code=code)
    assert envreport.mps_status(facts, 10) == "fails: the check process exited with code 3: Metal device lost"


@pytest.mark.parametrize("facts, status", [
    ({"mps_built": False}, "not built"),
    ({"mps_built": True, "mps_available": False}, "built, unavailable"),
    ({"mps_built": True, "mps_available": True, "mps_check": "works"}, "works"),
    ({"mps_built": True, "mps_available": True, "mps_check": "fails: RuntimeError: no Metal"}, "fails: RuntimeError"),
    ({"torch_error": "ImportError: libc10.dylib"}, "unknown: torch ImportError"),
])
def test_mps_status_words(facts, status):
    assert envreport.mps_status(facts, 20).startswith(status)


def test_cuda_devices_are_listed_with_capability():
    facts = {"torch_cuda": "13.0", "cuda_devices": [
        {"name": "NVIDIA H200", "capability": "9.0", "memory_gib": 139.8}] * 2}
    assert envreport.cuda_status(facts, M2) == ("0: NVIDIA H200 (capability 9.0, 139.8 GiB); "
                                                "1: NVIDIA H200 (capability 9.0, 139.8 GiB)")


# ---------------------------------------------------------------- environment and profile


def test_only_relevant_variables_and_no_secrets():
    environ = {"PYTORCH_ENABLE_MPS_FALLBACK": "1", "HOME": "/h", "ACCELERATE_USE_CPU": "false",
               "CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": "x", "MPSLAUNCH_API_KEY": "k", "PATH": "/bin"}
    assert envreport.relevant_environment(environ) == {
        "ACCELERATE_USE_CPU": "false", "CUDA_VISIBLE_DEVICES": "0",
        "MPSLAUNCH_API_KEY": "<set, not shown>", "PYTORCH_ENABLE_MPS_FALLBACK": "1"}


def test_profile_facts_on_a_mac(tmp_path, monkeypatch):
    monkeypatch.setenv("MPSLAUNCH_CONFIG_DIR", str(tmp_path))
    facts = envreport.profile_facts(M2, {}, None, None)
    assert facts["profile"] == "none: defaults"
    assert facts["launcher_choice"].startswith("mps: Apple M2, macOS 14.5")

    profile_files.save(Profile(device="cuda"), tmp_path / "gpu.yaml")
    facts = envreport.profile_facts(M2, {}, None, "gpu")
    assert facts["profile"]["device"] == "cuda" and facts["launcher_choice"].startswith("refuses: ")

    (tmp_path / "broken.yaml").write_text("devise: mps\n")
    facts = envreport.profile_facts(M2, {}, None, "broken")
    assert facts["profile"].startswith("unreadable: ") and "did you mean 'device'" in facts["profile"]


def test_a_fence_inside_a_value_cannot_end_the_block(tmp_path, monkeypatch):
    monkeypatch.setenv("MPSLAUNCH_CONFIG_DIR", str(tmp_path))
    facts = envreport.gather(M2._replace(torch_version=None),
                             {"PYTORCH_X": "```oops"}, None, None)
    block = envreport.as_markdown(facts)
    assert block.count("```") == 2 and "PYTORCH_X='''oops" in block
    assert "- macOS: 14.5" in block and "- Chip: Apple M2" in block and "- torch: not installed" in block
