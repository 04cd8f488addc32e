"""torch's verdict on mps, macOS virtual machines and macOS 26: the rules on described machines,
the verdict's words, its cache (per Python, torch and macOS build), and the macOS probe's parsing.
Through the CLI on a described Mac: tests/commands/test_described_mac.py."""

from __future__ import annotations

import marshal
import sys

import pytest

from helpers import MACHINES, MPS_WORKS
from mpslaunch.machine import torch_check
from mpslaunch.output import MpslaunchError
from mpslaunch.machine.facts import (_macos_version, mps_cache_key, parse_sysctl, verify_mps,
                                     with_torch_facts)
from mpslaunch.plan import resolve
from mpslaunch.plan.known_faults import warnings_for
from mpslaunch.settings import LaunchRequest
from mpslaunch.settings import Profile
from mpslaunch.machine import MpsAnswer


def plan_for(machine: str, **flags):
    return resolve(Profile(), LaunchRequest("train.py", **flags), MACHINES[machine], {})


def known_faults(machine: str, plan) -> tuple[str, ...]:
    """The warnings the plan carries for its chip's and torch's known faults (M1 and M2)."""
    described = MACHINES[machine]
    return warnings_for(described.torch_version, described.chip, described.macos_version,
                        plan.settings.mixed_precision, plan.device, described.accelerate_version)


# ---------------------------------------------------------------- described machines

@pytest.mark.parametrize("machine, device, reason_part", [
    ("m3_macos14", "mps", "mps: Apple M3 Pro, macOS 14.7, torch 2.14.1"),
    ("m4_macos15", "mps", "mps: Apple M4 Max, macOS 15.5"),
    ("m4_macos26.0", "mps", "macOS 26.0"),
    ("m2_macos26.3", "mps", "macOS 26.3"),  # torch not asked yet: the platform rules alone
    ("m2_macos26.3_torch_says_no", "cpu", "The MPS backend is supported on macOS 14.0+"),
    ("mac_vm", "cpu", "virtual machine (kern.hv_vmm_present=1)"),
])
def test_auto_follows_torchs_verdict_and_the_platform(machine, device, reason_part):
    plan = plan_for(machine)
    assert (plan.device, plan.warnings) == (device, known_faults(machine, plan))
    assert reason_part in plan.reason


def test_when_torch_says_no_the_plan_line_gives_its_reason_when_it_was_asked_and_the_fix():
    plan = plan_for("m2_macos26.3_torch_says_no")
    assert plan.reason.startswith("cpu: torch 2.10.0 cannot use mps on this Mac: ")
    assert "(checked 2026-03-19 14:02)" in plan.reason and "pip install -U torch" in plan.reason
    assert plan.env["ACCELERATE_USE_CPU"] == "true" and plan.env["MPSLAUNCH_DEVICE"] == "cpu"


def test_device_mps_is_refused_with_torchs_reason():
    with pytest.raises(MpslaunchError) as caught:
        plan_for("m2_macos26.3_torch_says_no", device="mps")
    message = str(caught.value)
    assert message.startswith("--device mps asks for mps, but torch 2.10.0 cannot use mps")
    assert "is_available() is False" in message and "--cpu" in message and "\n" not in message


def test_device_mps_in_a_virtual_machine_runs_with_one_warning():
    plan = plan_for("mac_vm", device="mps")
    assert plan.device == "mps" and plan.env["ACCELERATE_TORCH_DEVICE"] == "mps"
    assert "virtual machine is known to fail" in plan.warnings[0]
    assert plan.warnings[1:] == known_faults("mac_vm", plan)


@pytest.mark.parametrize("usable", [True, False])
def test_auto_in_a_virtual_machine_gives_the_vm_reason_whatever_torch_said(usable):
    # A tiny check can pass in a VM where training then fails (actions/runner-images#11899).
    vm = MACHINES["mac_vm"]._replace(mps_answer=MpsAnswer(usable, "works" if usable else "a 64x64 "
                 "matmul on mps fails: RuntimeError: MPS backend out of memory", "", "now"))
    plan = resolve(Profile(), LaunchRequest("train.py"), vm, {})
    assert plan.device == "cpu" and "this Mac is a virtual machine" in plan.reason


def test_torch_saying_no_in_a_virtual_machine_is_refused_too():
    vm = MACHINES["mac_vm"]._replace(mps_answer=MpsAnswer(
        False, "a 64x64 matmul on mps fails: RuntimeError: MPS backend out of memory", "fix", "now"))
    with pytest.raises(MpslaunchError, match="MPS backend out of memory"):
        resolve(Profile(), LaunchRequest("train.py", device="mps"), vm, {})


@pytest.mark.parametrize("machine", ["m4_macos26.0", "m2_macos26.3"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_macos_26_counts_as_newer_than_15(machine, precision):
    assert plan_for(machine, mixed_precision=precision).device == "mps"


def test_a_verdict_changes_nothing_off_a_mac():
    said_no = MpsAnswer(False, "this torch build has no mps", "fix", "now")
    for name in ("linux_cpu", "linux_8gpu"):
        request = LaunchRequest("train.py")
        assert (resolve(Profile(), request, MACHINES[name]._replace(mps_answer=said_no), {})
                == resolve(Profile(), request, MACHINES[name], {}))


# ---------------------------------------------------------------- the verdict's words

@pytest.mark.parametrize("facts, usable, part", [
    ({"mps_built": True, "mps_available": True, "mps_check": "works"}, True, "works"),
    ({"mps_built": False}, False, "this torch build has no mps"),
    ({"mps_built": True, "mps_available": False, "mps_reason": "RuntimeError: needs macOS 14.0+"},
     False, "is_available() is False (RuntimeError: needs macOS 14.0+)"),
    ({"mps_built": True, "mps_available": True, "mps_check": "fails: RuntimeError: MPS backend out of memory"},
     False, "a 64x64 matmul on mps fails: RuntimeError: MPS backend out of memory"),
    ({"torch_error": "ImportError: libc10.dylib"}, False, "torch cannot be imported (ImportError"),
    ({"check_error": "the check process exited with code -11: "}, False, "the check failed"),
])
def test_verdict_words(facts, usable, part):
    answer = torch_check.mps_answer(facts, checked_at="2026-03-19 14:02")
    assert (answer.usable, answer.checked_at) == (usable, "2026-03-19 14:02")
    assert part in answer.detail
    assert (answer.fix == "") == usable


# ---------------------------------------------------------------- the cache

def described_mac(**changes):
    return MACHINES["m2_macos26.3"]._replace(**{"python": sys.executable, "os_build": "25D125", **changes})


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="needs a torch without mps, as on Linux")
def test_the_real_check_is_kept_per_python_torch_and_macos_build():
    mac = described_mac()
    verified = verify_mps(mac, timeout=120)  # a real child: no Linux torch has mps
    assert verified.mps_answer is not None and not verified.mps_answer.usable
    assert verified.mps_answer.detail == "this torch build has no mps"
    assert torch_check.read_cached(mps_cache_key(mac)) == verified.mps_answer
    for other in (described_mac(os_build="25E5"), described_mac(torch_version="2.15.0"),
                  described_mac(python="/opt/homebrew/bin/python3")):
        assert torch_check.read_cached(mps_cache_key(other)) is None  # asked again


@pytest.mark.slow
def test_a_check_that_gives_no_verdict_in_time_keeps_nothing(isolated_cache_dir):
    mac = described_mac()
    assert verify_mps(mac, timeout=0.01) == mac
    assert list(isolated_cache_dir.iterdir()) == []


@pytest.mark.parametrize("facts", [
    {"check_error": "the check process exited with code -9: "},
    {"torch_error": "ImportError: cannot import name 'Random' from 'random' (/home/me/random.py)"},
])
def test_only_torchs_own_answer_is_kept(isolated_cache_dir, facts):
    mac = described_mac()
    said = with_torch_facts(mac, facts)
    assert not said.mps_answer.usable and "the next launch asks again" in said.mps_answer.fix
    assert list(isolated_cache_dir.iterdir()) == []
    with_torch_facts(mac, {"torch": "2.14.1", "mps_built": False})
    assert torch_check.read_cached(mps_cache_key(mac)).detail == "this torch build has no mps"


def test_the_checks_child_gets_the_users_environment_less_what_is_not_about_torch():
    given = {"PYTHONPATH": "/opt/site:lib", "PYTHONWARNINGS": "error", "PYTHONINSPECT": "1",
             "PYTHONUSERBASE": "/u", "HOME": "/home/me"}
    assert torch_check.check_environment(given) == {
        "PYTHONPATH": "/opt/site:lib", "PYTHONUSERBASE": "/u", "HOME": "/home/me",
        "PYTHONSAFEPATH": "1"}


@pytest.mark.parametrize("damage", ["not marshal", "a list", "an entry of another shape",
                                    "keys that are not names", "empty", "cut short"])
def test_a_damaged_cache_is_ignored_and_rewritten(isolated_cache_dir, damage):
    key = mps_cache_key(described_mac())
    path = isolated_cache_dir / torch_check.CACHE_FILE
    path.write_bytes({"not marshal": b"{not marshal", "a list": marshal.dumps([1, 2]),
                      "an entry of another shape": marshal.dumps({key: {"usable": True}}),
                      "keys that are not names": marshal.dumps({key: {1: 2}}), "empty": b"",
                      "cut short": marshal.dumps({key: MPS_WORKS._asdict()})[:-5]}[damage])
    assert torch_check.read_cached(key) is None
    torch_check.save(key, MPS_WORKS)
    assert torch_check.read_cached(key) == MPS_WORKS
    assert list(marshal.loads(path.read_bytes())) == [key]
    assert [p.name for p in isolated_cache_dir.iterdir()] == [torch_check.CACHE_FILE]


def test_the_cache_keeps_the_latest_entries(isolated_cache_dir):
    for number in range(25):
        torch_check.save(f"python | torch 2.{number} | build X", MPS_WORKS)
    kept = marshal.loads((isolated_cache_dir / torch_check.CACHE_FILE).read_bytes())
    assert list(kept) == [f"python | torch 2.{number} | build X" for number in range(5, 25)]


def test_no_key_off_a_mac_or_without_torch():
    assert mps_cache_key(MACHINES["linux_cpu"]) is None
    assert mps_cache_key(MACHINES["m2_no_torch"]._replace(os_build="23F79")) is None


# ---------------------------------------------------------------- the macOS probe

@pytest.mark.parametrize("text, version", [
    ("26.3", (26, 3)), ("26.0", (26, 0)), ("15.7.1", (15, 7, 1)), ("14.5", (14, 5)),
    ("16.3", (26, 3)), ("16.0", (26, 0)),  # what an old-SDK Python is told on macOS 26
])
def test_macos_version(text, version):
    assert _macos_version(text) == version


def test_sysctl_lines_are_read_by_name():
    text = ("kern.osproductversion: 26.3\nkern.osversion: 25D125\n"
            "machdep.cpu.brand_string: Apple M2 Max\nkern.hv_vmm_present: 1\nkern.other: x\n")
    assert parse_sysctl(text) == {"kern.osproductversion": "26.3", "kern.osversion": "25D125",
                                  "machdep.cpu.brand_string": "Apple M2 Max",
                                  "kern.hv_vmm_present": "1"}
