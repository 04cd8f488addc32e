"""What the plan warns about before the script starts, on described machines: the known faults
of the torch and Accelerate in use (tests/plan/test_known_faults.py has one test per row), and
what may pause a run on a Mac (no caffeinate on PATH, a laptop on its battery)."""

from __future__ import annotations


from helpers import MACHINES
from mpslaunch.plan import resolve
from mpslaunch.settings import LaunchRequest, Profile


def plan_on(machine, profile: Profile | None = None, **flags):
    return resolve(profile or Profile(), LaunchRequest("train.py", (), **flags), machine, {})


M2_OLD = MACHINES["m2_macos15"]._replace(torch_version="2.12.1", accelerate_version="1.10.1")
M4 = MACHINES["m4_macos15"]._replace(accelerate_version="1.15.0")


def test_a_plan_carries_one_warning_per_fault_it_meets():
    plan = plan_on(M2_OLD, mixed_precision="fp16")
    assert plan.device == "mps"
    grad_scaler, matmul, accelerate = plan.warnings
    assert grad_scaler.startswith("fp16 on mps with torch 2.12.1: GradScaler's unscale zeroes ")
    assert matmul.startswith("on an M1 or M2 GPU with torch 2.12.1, matrix products over ")
    assert accelerate.startswith("fp16 on mps with Accelerate 1.10.1: an unmodified "
                                 "Accelerator() refuses it")
    described = plan.describe()  # what --dry-run prints
    assert all(f"warning: {warning}" in described for warning in plan.warnings)


def test_a_current_mac_meets_none_and_the_cpu_plan_none_of_mps():
    assert plan_on(M4, mixed_precision="bf16").warnings == ()
    assert plan_on(M2_OLD, cpu=True, mixed_precision="bf16").warnings == ()


def test_without_caffeinate_the_plan_does_not_say_kept_awake():
    without = M4._replace(caffeinate=False)
    plan = plan_on(without)
    assert not plan.keep_awake and "kept awake" not in plan.summary()
    assert plan.warnings == ("caffeinate is not on PATH (it is /usr/bin/caffeinate), so nothing "
                             "keeps this Mac awake: it may sleep and pause the run; keep_awake: "
                             "false in the profile (or --no_keep_awake) silences this",)
    assert "keep awake:" not in plan.describe()
    assert plan_on(without, keep_awake=False).warnings == ()  # silenced
    with_it = plan_on(M4)
    assert with_it.keep_awake and with_it.summary().endswith("; kept awake while it runs")
    assert with_it.warnings == ()


def test_on_battery_the_plan_says_closing_the_lid_pauses_the_run():
    laptop = M4._replace(on_battery=True)
    plan = plan_on(laptop)
    assert plan.keep_awake and plan.warnings == (
        "this Mac runs on its battery: closing the lid sleeps it and pauses the run; keep_awake: "
        "false in the profile (or --no_keep_awake) silences this",)
    assert plan_on(laptop, keep_awake=False).warnings == ()
    assert plan_on(laptop, profile=Profile(keep_awake=False)).warnings == ()
    assert plan_on(M4._replace(on_battery=False)).warnings == ()
    assert plan_on(M4._replace(on_battery=None)).warnings == ()  # pmset gave no answer


def test_off_a_mac_nothing_about_sleep():
    linux = MACHINES["linux_1gpu"]._replace(caffeinate=False, on_battery=True)
    assert plan_on(linux).warnings == () and not plan_on(linux).keep_awake
