"""Several processes or machines on described computers: refused on mps, torchrun elsewhere.

The refusal happens in resolve(), before anything starts: through the CLI it exits 2 with one
line that says why (gloo and nccl do not work with mps tensors) and what to do instead, and the
torchrun path is never entered. The questionnaire never offers it.
"""

from __future__ import annotations

import pytest

from helpers import MACHINES, write_script
from mpslaunch import commands as cli, machine as machine_probe
from mpslaunch.output import MpslaunchError
from mpslaunch.plan import resolve
from mpslaunch.settings import LaunchRequest
from mpslaunch.settings import Profile
from mpslaunch.settings.profile_files import save
from mpslaunch.commands.config.questions import process_counts, several_machines_possible

# Apple silicon Macs where this torch's mps works: auto means mps there.
MPS_MACS = ["m1_macos14", "m2_macos15", "m3_macos15_torch2.5", "m1_macos13_torch2.8",
            "m1_macos12_torch2.4"]
SEVERAL = [
    pytest.param({"num_processes": 2}, id="2-processes"),
    pytest.param({"num_processes": 8}, id="8-processes"),
    pytest.param({"num_machines": 2, "main_process_ip": "10.0.0.2"}, id="2-machines"),
    pytest.param({"num_processes": 2, "num_machines": 3, "machine_rank": 1,
                  "main_process_ip": "10.0.0.2", "rdzv_backend": "c10d"}, id="2x3-c10d"),
]


def resolve_on(machine: str, profile: Profile | None = None, **flags):
    request = LaunchRequest("train.py", **flags)
    return resolve(profile or Profile(), request, MACHINES[machine], {})


def refusal(machine: str, profile: Profile | None = None, **flags) -> str:
    with pytest.raises(MpslaunchError) as caught:
        resolve_on(machine, profile, **flags)
    assert caught.value.exit_code == 2
    return str(caught.value)


def assert_explains_mps(message: str) -> None:
    assert "cannot train on mps" in message
    assert "gloo" in message and "nccl" in message and "mps tensors" in message
    assert "--cpu --num_processes" in message and "NVIDIA" in message
    assert "\n" not in message


@pytest.mark.parametrize("machine", MPS_MACS)
@pytest.mark.parametrize("several", SEVERAL)
def test_flags_asking_for_several_on_mps_are_refused(machine, several):
    assert_explains_mps(refusal(machine, **several))
    assert_explains_mps(refusal(machine, device="mps", **several))


@pytest.mark.parametrize("machine", MPS_MACS)
@pytest.mark.parametrize("several", SEVERAL)
def test_profiles_asking_for_several_on_mps_are_refused(machine, several):
    assert_explains_mps(refusal(machine, Profile(**several)))
    assert_explains_mps(refusal(machine, Profile(device="mps", **several)))


@pytest.mark.parametrize("machine", MPS_MACS)
def test_a_profile_with_several_is_refused_even_when_the_flag_asks_for_mps(machine):
    assert_explains_mps(refusal(machine, Profile(device="cpu", num_processes=4), device="mps"))


@pytest.mark.parametrize("machine", MPS_MACS)
def test_the_suggested_cpu_run_is_accepted(machine):
    plan = resolve_on(machine, Profile(num_processes=4), cpu=True)
    assert (plan.device, plan.engine, plan.settings.num_processes) == ("cpu", "torchrun", 4)
    assert plan.env["ACCELERATE_USE_CPU"] == "true"


@pytest.mark.parametrize("machine", MPS_MACS)
def test_one_mps_process_stays_single(machine):
    plan = resolve_on(machine, Profile(num_processes=1))
    assert (plan.device, plan.engine) == ("mps", "single")


@pytest.mark.parametrize("machine, reason", [
    ("m1_macos13_torch2.14", "needs macOS 14"),  # no mps for this torch: auto is cpu
    ("intel_mac", "Intel Mac"),
    ("rosetta", "Rosetta"),
    ("m2_no_torch", "pip install torch"),
])
def test_macs_without_usable_mps_run_several_cpu_processes(machine, reason):
    plan = resolve_on(machine, num_processes=2)
    assert (plan.device, plan.engine) == ("cpu", "torchrun")
    assert reason in plan.reason


@pytest.mark.parametrize("processes", [2, 8])
def test_cuda_runs_one_process_per_gpu_through_torchrun(processes):
    plan = resolve_on("linux_8gpu", num_processes=processes)
    assert (plan.device, plan.engine, plan.settings.num_processes) == ("cuda", "torchrun", processes)
    assert "ACCELERATE_TORCH_DEVICE" not in plan.env  # each rank picks its GPU from LOCAL_RANK


@pytest.mark.parametrize("machine", MPS_MACS)
def test_the_questionnaire_never_offers_several_on_mps(machine):
    assert process_counts("mps", MACHINES[machine]) == (1,)
    assert not several_machines_possible("mps", MACHINES[machine])
    assert max(process_counts("cpu", MACHINES[machine])) > 1


# ---------------------------------------------------------------- through the CLI


@pytest.fixture
def on_a_mac(monkeypatch):
    """The CLI in this process, on an M2 Mac, with the torchrun path booby-trapped."""
    monkeypatch.setattr(machine_probe, "probe", lambda: MACHINES["m2_macos15"])

    def must_not_run(*_args, **_kwargs):
        raise AssertionError("the torchrun path started")

    import mpslaunch.run.torchrun.elastic as torchrun
    monkeypatch.setattr(torchrun, "run", must_not_run)
    monkeypatch.setattr(torchrun, "describe", must_not_run)


@pytest.mark.parametrize("flags", [
    ["--num_processes", "2"],
    ["--num-processes", "4", "--device", "mps"],
    ["--num_machines", "2", "--main_process_ip", "10.0.0.2"],
    ["--num_processes", "2", "--dry-run"],
])
def test_cli_refuses_before_anything_starts(tmp_path, capsys, on_a_mac, flags):
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    code = cli.main(["launch", *flags, str(script)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("mpslaunch: error: ") and err.count("\n") == 1
    assert_explains_mps(err.strip())
    assert not (tmp_path / "train.py.ran").exists()


def test_cli_refuses_a_profile_with_several_processes(tmp_path, capsys, on_a_mac):
    script = write_script(tmp_path, "train.py", "")
    save(Profile(num_processes=3), tmp_path / "p.yaml")
    assert cli.main(["launch", "--config_file", str(tmp_path / "p.yaml"), str(script)]) == 2
    assert_explains_mps(capsys.readouterr().err.strip())


@pytest.mark.parametrize("machine, processes", [("linux_2gpu", 2), ("linux_8gpu", 8), ("linux_1gpu", 1)])
def test_cli_dry_run_plans_one_process_per_gpu(tmp_path, capsys, monkeypatch, machine, processes):
    monkeypatch.setattr(machine_probe, "probe", lambda: MACHINES[machine])
    script = write_script(tmp_path, "train.py", "")
    assert cli.main(["launch", "--dry-run", str(script)]) == 0
    out = capsys.readouterr().out
    assert f"processes:       {processes} per machine" in out
    if processes > 1:
        assert "(one per visible GPU, default)" in out and f"--nproc-per-node {processes}" in out
    assert cli.main(["launch", "--dry-run", "--num_processes", "1", str(script)]) == 0
    assert "engine:          single" in capsys.readouterr().out
