"""Every example profile in configs/ loads and resolves on the machine it is written for."""

from __future__ import annotations

import pytest

from helpers import MACHINES, REPO
from mpslaunch.settings import profile_files
from mpslaunch.plan import resolve
from mpslaunch.settings import LaunchRequest


@pytest.mark.parametrize("name, machine, device, engine, world_size", [
    ("mac.yaml", "m2_macos15", "mps", "single", 1),
    ("cpu.yaml", "m2_macos15", "cpu", "single", 1),
    ("cpu.yaml", "linux_8gpu", "cpu", "single", 1),
    ("cpu-4proc.yaml", "m1_macos14", "cpu", "torchrun", 4),
    ("cuda-8gpu.yaml", "linux_8gpu", "cuda", "torchrun", 8),
    ("two-machines.yaml", "linux_8gpu", "cuda", "torchrun", 16),
])
def test_example_profile_resolves(name, machine, device, engine, world_size):
    profile = profile_files.load(REPO / "configs" / name)
    plan = resolve(profile, LaunchRequest("train.py"), MACHINES[machine], {})
    assert (plan.device, plan.engine, plan.world_size) == (device, engine, world_size)


def test_mac_profile_sets_consistent_watermarks():
    plan = resolve(profile_files.load(REPO / "configs" / "mac.yaml"), LaunchRequest("t.py"), MACHINES["m1_macos14"], {})
    assert float(plan.env["PYTORCH_MPS_LOW_WATERMARK_RATIO"]) <= float(plan.env["PYTORCH_MPS_HIGH_WATERMARK_RATIO"])


def test_every_example_profile_is_tested():
    tested = {"mac.yaml", "cpu.yaml", "cpu-4proc.yaml", "cuda-8gpu.yaml", "two-machines.yaml"}
    assert {path.name for path in (REPO / "configs").glob("*.yaml")} == tested
