"""The plan's side of what runs beside the script: keeping a Mac awake, the fault handler in the
child's environment, and torch.compile on mps refused with a torch that cannot compile for it."""

from __future__ import annotations

import pytest

from helpers import MACHINES
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import LaunchRequest
from mpslaunch.plan import resolve
from mpslaunch.settings import Profile

MACS = ["m1_macos14", "m2_macos15", "m4_macos26.0", "mac_vm", "intel_mac", "rosetta"]
NOT_MACS = ["linux_cpu", "linux_1gpu", "linux_2gpu"]


def plan_for(machine: str, profile: Profile | None = None, environ: dict | None = None, **flags):
    return resolve(profile or Profile(), LaunchRequest("train.py", **flags), MACHINES[machine],
                   environ or {})


# ---------------------------------------------------------------- keep awake


@pytest.mark.parametrize("machine", MACS)
def test_a_mac_is_kept_awake_by_default_and_the_plan_says_so(machine):
    plan = plan_for(machine, cpu=True)
    assert plan.keep_awake
    assert plan.summary().endswith("; kept awake while it runs")
    assert "keep awake:      caffeinate -i -w <launcher pid> while the run lasts" in plan.describe()


@pytest.mark.parametrize("machine", MACS)
def test_the_profile_key_and_the_flag_turn_it_off(machine):
    for plan in (plan_for(machine, Profile(keep_awake=False), cpu=True),
                 plan_for(machine, cpu=True, keep_awake=False)):
        assert not plan.keep_awake
        assert "kept awake" not in plan.summary() and "keep awake" not in plan.describe()
    # The flag wins over the profile only to turn it off; a profile that says true keeps it.
    assert plan_for(machine, Profile(keep_awake=True), cpu=True).keep_awake


@pytest.mark.parametrize("machine", NOT_MACS)
def test_elsewhere_nothing_changes(machine):
    plan = plan_for(machine, Profile(keep_awake=True))
    assert not plan.keep_awake and "awake" not in plan.summary() + plan.describe()


def test_keep_awake_is_a_checked_profile_key(tmp_path):
    from mpslaunch.settings import profile_files as profiles

    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nkeep_awake: 'yes'\n")
    with pytest.raises(MpslaunchError, match=r"line 2: keep_awake must be bool"):
        profiles.load(path)
    path.write_text("version: 1\nkeep_awake: false\n")
    assert profiles.load(path).keep_awake is False


# ---------------------------------------------------------------- the fault handler


@pytest.mark.parametrize("machine", ["m1_macos14", "linux_cpu", "linux_2gpu"])
def test_the_child_gets_the_fault_handler_unless_the_user_set_it(machine):
    assert plan_for(machine).env["PYTHONFAULTHANDLER"] == "1"
    for mine in ("0", "", "1"):  # "" turns it off in Python; the user's choice stands
        plan = plan_for(machine, environ={"PYTHONFAULTHANDLER": mine})
        assert "PYTHONFAULTHANDLER" not in plan.env and not plan.replaced


# ---------------------------------------------------------------- torch.compile on mps


@pytest.mark.parametrize("machine", ["m3_macos15_torch2.5", "m1_macos12_torch2.4"])
@pytest.mark.parametrize("backend", ["inductor", "cudagraphs", "onnxrt"])
def test_dynamo_on_mps_with_an_old_torch_is_refused_with_the_version_to_install(machine, backend):
    with pytest.raises(MpslaunchError) as refused:
        plan_for(machine, dynamo_backend=backend)
    message = str(refused.value)
    assert message.startswith(f"--dynamo_backend {backend} asks torch.compile for mps")
    assert f"this is torch {MACHINES[machine].torch_version}" in message
    assert "pip install -U 'torch>=2.8'" in message
    with pytest.raises(MpslaunchError, match=r"^dynamo_backend: inductor in the profile asks "):
        plan_for(machine, Profile(dynamo_backend="inductor"))


def test_dynamo_on_mps_with_torch_2_7_is_refused_and_2_8_runs():
    seven = MACHINES["m1_macos13_torch2.8"]._replace(torch_version="2.7.1")
    with pytest.raises(MpslaunchError, match=r"compiles for mps from torch 2\.8 and this is torch 2\.7\.1"):
        resolve(Profile(), LaunchRequest("train.py", dynamo_backend="inductor"), seven, {})
    plan = plan_for("m1_macos13_torch2.8", dynamo_backend="inductor")
    assert plan.device == "mps" and plan.env["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"
    assert plan_for("m4_macos15", dynamo_backend="inductor").device == "mps"


@pytest.mark.parametrize("backend", ["no", "eager", "aot_eager"])
def test_backends_that_generate_no_kernels_run_on_mps_with_any_torch(backend):
    assert plan_for("m3_macos15_torch2.5", dynamo_backend=backend).device == "mps"


def test_dynamo_off_mps_is_not_this_rules_business():
    assert plan_for("m3_macos15_torch2.5", cpu=True, dynamo_backend="inductor").device == "cpu"
    assert plan_for("linux_1gpu", dynamo_backend="inductor").device == "cuda"
