"""Tests for `mpslaunch test` and its bundled check script, on cpu with 1 and 2 processes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import MACHINES, run_cli
from mpslaunch.commands import test as selftest
from mpslaunch.output import MpslaunchError
from mpslaunch.commands.test import CHECK_SCRIPT, Outcome, collect, format_outcomes


def lines_of(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if line[:4] in ("PASS", "FAIL")]


def check_names(done: subprocess.CompletedProcess) -> list[tuple[str, str]]:
    return [(line[:4], line[6:].split("  ")[0].strip()) for line in lines_of(done)]


# ---- through the real launch path -----------------------------------------------------------

@pytest.mark.slow
def test_one_cpu_process_passes():
    done = run_cli("test", "--cpu")
    assert done.returncode == 0, done.stdout + done.stderr
    assert check_names(done) == [("PASS", "device"), ("PASS", "train step"), ("PASS", "numbers"),
                                 ("PASS", "mixed precision")]
    assert done.stdout.splitlines()[0].startswith("mpslaunch: cpu")
    assert "30 tensors of 3 training steps on cpu in float32 match the CPU's float64" in done.stdout
    assert done.stdout.splitlines()[-1] == "mpslaunch test: all 4 checks passed"


@pytest.mark.slow
def test_two_cpu_processes_from_a_profile_pass_with_an_all_reduce(tmp_path):
    profile = tmp_path / "two.yaml"
    profile.write_text("version: 1\ndevice: cpu\nmixed_precision: bf16\nnum_processes: 2\n")
    done = run_cli("test", "--config_file", str(profile))
    assert done.returncode == 0, done.stdout + done.stderr
    assert check_names(done) == [("PASS", "device"), ("PASS", "train step"), ("PASS", "numbers"),
                                 ("PASS", "mixed precision"), ("PASS", "all-reduce")]
    text = done.stdout
    assert "2 ranks summed to 3 over gloo" in text
    assert "bf16: autocast computes in torch.bfloat16" in text
    assert "(all 2 ranks)" in text


@pytest.mark.slow
def test_a_check_that_fails_says_what_to_change_and_exits_1():
    # A variable of the user's own that makes Accelerate ignore the plan.
    done = run_cli("test", "--cpu", env={"ACCELERATE_TORCH_DEVICE": "meta"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("FAIL", "device") in check_names(done)
    assert "Accelerator() put this process on meta, the plan says cpu" in done.stdout
    assert "what to change: unset ACCELERATE_TORCH_DEVICE=meta" in done.stdout
    assert done.stdout.splitlines()[-1] == "mpslaunch test: 3 of 4 checks passed"


@pytest.mark.slow
def test_json_gives_the_plan_and_every_check_with_its_fix():
    done = run_cli("test", "--cpu", "--json", env={"ACCELERATE_TORCH_DEVICE": "meta"})
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["plan"].startswith("mpslaunch: cpu") and report["device"] == "cpu"
    assert report["passed"] is False and report["processes"] == 1
    device = next(check for check in report["checks"] if check["name"] == "device")
    assert device["ok"] is False and "unset ACCELERATE_TORCH_DEVICE=meta" in device["fix"]
    assert [check["name"] for check in report["checks"]] == ["device", "train step", "numbers",
                                                             "mixed precision"]
    numbers = next(check for check in report["checks"] if check["name"] == "numbers")
    figures = numbers["figures"]["0"]  # rank 0's
    assert figures["device"] == "cpu" and figures["dtype"] == "float32"
    assert figures["tolerance"] == 1e-4 and figures["tensors"] == 30
    assert 0 < figures["largest_error"] <= 1e-4 and figures["first_mismatch"] is None


# Loaded by every Python of the test run through PYTHONPATH; in the check script only, it makes
# each float32 SGD step move the weights 10% further than asked: a device that computes wrong.
PERTURBED_STEP = """
import os, sys
if os.path.basename(sys.argv[0]) == "selfcheck.py":
    import torch
    honest_step = torch.optim.SGD.step

    def perturbed_step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"]]
        before = [p.detach().clone() for p in params]
        result = honest_step(self, closure)
        with torch.no_grad():
            for old, p in zip(before, params):
                if p.dtype == torch.float32:
                    p.copy_(old + (p - old) * 1.1)
        return result

    torch.optim.SGD.step = perturbed_step
"""


@pytest.mark.slow
def test_a_perturbed_step_fails_the_numbers_and_names_the_first_tensor(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(PERTURBED_STEP)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    done = run_cli("test", "--cpu", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("FAIL", "numbers") in check_names(done) and ("PASS", "train step") in check_names(done)
    failed = next(line for line in lines_of(done) if "numbers" in line)
    assert failed.endswith("step 1 update of 0.weight on cpu in float32 differs from the CPU's "
                           "float64 by 0.1 of its scale, above the 0.0001 allowed for float32")
    assert "what to change: cpu computes other numbers than the CPU" in done.stdout

    report = json.loads(run_cli("test", "--cpu", "--json", env=env).stdout)
    numbers = next(check for check in report["checks"] if check["name"] == "numbers")
    assert numbers["ok"] is False and report["passed"] is False
    assert numbers["figures"]["0"]["first_mismatch"] == "step 1 update of 0.weight"
    assert numbers["figures"]["0"]["mismatch_error"] == pytest.approx(0.1, rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("argv, message", [
    (["--cpu", "--mixed_precision", "fp16"], "fp16 mixed precision does not run on cpu"),
    (["--device", "mps"], "asks for mps, but mps needs a Mac"),
])
def test_an_impossible_plan_fails_before_launching(argv, message):
    done = run_cli("test", *argv)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr


# ---- the plan handed to the check script ----------------------------------------------------

def namespace(**overrides) -> argparse.Namespace:
    values = dict(config_file=None, profile=None, cpu=False, device=None, mixed_precision=None,
                  num_processes=None, timeout=60.0)
    return argparse.Namespace(**{**values, **overrides})


def script_expectations(plan) -> dict[str, str]:
    args = plan.command[plan.command.index(str(CHECK_SCRIPT)) + 1:]
    return dict(zip(args[::2], args[1::2]))


def test_the_check_script_is_told_the_plan_of_a_mac(monkeypatch, tmp_path):
    monkeypatch.setattr("mpslaunch.machine.probe", lambda: MACHINES["m2_macos15"])
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    plan = selftest.resolve_plan(namespace(mixed_precision="bf16"), str(tmp_path))
    assert plan.device == "mps" and plan.engine == "single"
    assert script_expectations(plan) == {
        "--report-dir": str(tmp_path), "--expect-device": "mps", "--expect-precision": "bf16",
        "--expect-world-size": "1", "--expect-mps-fallback": "1", "--timeout": "60.0",
    }


def test_a_fallback_the_user_switched_off_is_expected_off(monkeypatch, tmp_path):
    monkeypatch.setattr("mpslaunch.machine.probe", lambda: MACHINES["m2_macos15"])
    monkeypatch.setenv("PYTORCH_ENABLE_MPS_FALLBACK", "0")
    plan = selftest.resolve_plan(namespace(), str(tmp_path))
    assert script_expectations(plan)["--expect-mps-fallback"] == "0"


def test_several_mps_processes_are_refused_like_launch(monkeypatch, tmp_path):
    monkeypatch.setattr("mpslaunch.machine.probe", lambda: MACHINES["m2_macos15"])
    with pytest.raises(MpslaunchError, match="cannot train on mps"):
        selftest.resolve_plan(namespace(num_processes=2), str(tmp_path))


# ---- the check script on its own ------------------------------------------------------------

def run_check_script(tmp_path: Path, *expect: str, env: dict | None = None) -> tuple[int, dict]:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("MPSLAUNCH_DEVICE", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(
        [sys.executable, str(CHECK_SCRIPT), "--report-dir", str(tmp_path), *expect],
        env={**environment, **(env or {})}, capture_output=True, text=True, timeout=120)
    report = json.loads((tmp_path / "rank-0.json").read_text())
    return done.returncode, {c["name"]: c for c in report["checks"]}


@pytest.mark.slow
def test_check_script_notices_a_missing_plan_and_a_wrong_world_size(tmp_path):
    code, checks = run_check_script(
        tmp_path, "--expect-device", "cpu", "--expect-precision", "no",
        "--expect-world-size", "2", env={"ACCELERATE_USE_CPU": "true"})
    assert code == 0  # the report carries the verdict
    assert not checks["device"]["ok"]
    assert "MPSLAUNCH_DEVICE is None, the plan says 'cpu'" in checks["device"]["detail"]
    assert checks["train step"]["ok"]
    assert not checks["all-reduce"]["ok"]
    assert checks["all-reduce"]["detail"] == "WORLD_SIZE is 1, the plan says 2"
    assert all(c["fix"] for c in checks.values() if not c["ok"])


@pytest.mark.slow
def test_check_script_watchdog_reports_a_hang(tmp_path):
    code, checks = run_check_script(
        tmp_path, "--expect-device", "cpu", "--expect-precision", "no",
        "--expect-world-size", "1", "--timeout", "0.01")
    assert code == 1
    [stuck] = checks.values()
    assert not stuck["ok"] and "did not finish within" in stuck["detail"]


# ---- merging the ranks' reports ---------------------------------------------------------------

def write_report(folder: Path, rank: int, *checks: tuple[str, bool]) -> None:
    document = {"rank": rank, "world_size": 2, "checks": [
        {"name": name, "ok": ok, "detail": f"{name} on rank {rank}", "fix": "do X" if not ok else ""}
        for name, ok in checks]}
    (folder / f"rank-{rank}.json").write_text(json.dumps(document))


def test_a_check_passes_only_if_every_rank_passed(tmp_path):
    write_report(tmp_path, 0, ("device", True), ("all-reduce", True))
    write_report(tmp_path, 1, ("device", True), ("all-reduce", False))
    outcomes = collect(tmp_path, expected_ranks=2, child_code=1)
    assert outcomes == [
        Outcome("device", True, "device on rank 0 (all 2 ranks)"),
        Outcome("all-reduce", False, "rank 1: all-reduce on rank 1", "do X"),
    ]


def test_a_rank_without_report_is_a_failure(tmp_path):
    write_report(tmp_path, 0, ("device", True))
    (tmp_path / "rank-1.json").write_text("{half a report")
    outcomes = collect(tmp_path, expected_ranks=2, child_code=139)
    assert outcomes[-1].name == "report" and not outcomes[-1].ok
    assert "1 of 2 process(es) ended without a report (launcher exit code 139)" in outcomes[-1].detail


def test_a_process_that_ends_badly_after_passing_every_check_fails_the_test(tmp_path):
    """A rank aborted after its report (torch's gloo exit): never 'all passed' below that."""
    write_report(tmp_path, 0, ("device", True), ("all-reduce", True))
    write_report(tmp_path, 1, ("device", True), ("all-reduce", True))
    outcomes = collect(tmp_path, expected_ranks=2, child_code=134)
    assert [(o.name, o.ok) for o in outcomes] == [("device", True), ("all-reduce", True), ("exit", False)]
    assert "exit code 134" in outcomes[-1].detail
    assert format_outcomes(outcomes).splitlines()[-1] == "mpslaunch test: 2 of 3 checks passed"
    assert collect(tmp_path, expected_ranks=2, child_code=0)[-1] == Outcome(
        "all-reduce", True, "all-reduce on rank 0 (all 2 ranks)")


def test_output_has_one_line_per_check_and_a_fix_under_each_failure():
    text = format_outcomes([Outcome("device", True, "cpu"),
                            Outcome("all-reduce", False, "summed to 2", "check the port")])
    assert text.splitlines() == [
        "PASS  device      cpu",
        "FAIL  all-reduce  summed to 2",
        "                  what to change: check the port",
        "mpslaunch test: 1 of 2 checks passed",
    ]
