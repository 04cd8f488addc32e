"""resolve() over described machines x profiles x flags: every rule, without owning the machines."""

from __future__ import annotations


import pytest

from helpers import MACHINES
from mpslaunch.output import MpslaunchError
from mpslaunch.plan import mps_minimum_macos, resolve
from mpslaunch.settings import LaunchRequest
from mpslaunch.settings import Profile


def plan_for(machine: str, profile: Profile | None = None, environ: dict | None = None, **flags):
    request = LaunchRequest("train.py", ("--lr", "0.1"), **flags)
    return resolve(profile or Profile(), request, MACHINES[machine], environ or {})


def refusal(machine: str, profile: Profile | None = None, environ: dict | None = None, **flags) -> str:
    with pytest.raises(MpslaunchError) as caught:
        plan_for(machine, profile, environ, **flags)
    message = str(caught.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- auto device

@pytest.mark.parametrize("machine, device, reason_part", [
    ("m1_macos14", "mps", "mps: Apple M1, macOS 14.5, torch 2.14.1"),
    ("m2_macos15", "mps", "Apple M2 Pro"),
    ("m3_macos15_torch2.5", "mps", "torch 2.5.1"),
    ("m1_macos13_torch2.8", "mps", "macOS 13.6"),  # torch 2.8 still supports macOS 13
    ("m1_macos12_torch2.4", "mps", "macOS 12.6"),
    ("m1_macos13_torch2.14", "cpu", "needs macOS 14"),  # torch 2.9+ dropped macOS 13
    ("m2_no_torch", "cpu", "pip install torch"),
    ("intel_mac", "cpu", "Intel Mac"),
    ("rosetta", "cpu", "Rosetta"),
    ("linux_cpu", "cpu", "no NVIDIA GPU"),
    ("linux_1gpu", "cuda", "cuda: 1 x NVIDIA H200"),
    ("linux_8gpu", "cuda", "8 x NVIDIA H200"),
    ("linux_gpu_cpu_torch", "cpu", "CPU-only build"),
])
def test_auto_device(machine, device, reason_part):
    plan = plan_for(machine)
    assert plan.device == device
    assert reason_part in plan.reason
    assert plan.engine == ("torchrun" if machine == "linux_8gpu" else "single")  # one per GPU


def test_apple_silicon_defaults_to_mps_never_use_cpu():
    plan = plan_for("m2_macos15")
    assert plan.env["ACCELERATE_USE_CPU"] == "false"
    assert plan.env["ACCELERATE_TORCH_DEVICE"] == "mps"
    assert plan.env["MPSLAUNCH_DEVICE"] == "mps"


@pytest.mark.parametrize("torch_version, needed", [
    ("2.4.1", (12, 3)), ("2.5.0", (13, 0)), ("2.8.0", (13, 0)), ("2.9.0", (14, 0)), ("2.14.1+cpu", (14, 0)),
])
def test_mps_minimum_macos(torch_version, needed):
    assert mps_minimum_macos(torch_version) == needed


# ---------------------------------------------------------------- explicit devices and precedence

@pytest.mark.parametrize("machine", ["m1_macos14", "linux_8gpu", "linux_cpu", "intel_mac"])
def test_cpu_flag_always_wins(machine):
    plan = plan_for(machine, Profile(device="mps" if "m1" in machine else "auto"), cpu=True)
    assert plan.device == "cpu"
    assert plan.reason == "cpu: asked for by --cpu"
    assert plan.env["ACCELERATE_USE_CPU"] == "true"
    assert "ACCELERATE_TORCH_DEVICE" not in plan.env


@pytest.mark.parametrize("machine, device, expected", [
    ("linux_cpu", "mps", "mps needs a Mac with Apple silicon"),
    ("linux_cpu", "cuda", "no NVIDIA GPU is visible"),
    ("m1_macos14", "cuda", "no NVIDIA GPU is visible"),
    ("rosetta", "mps", "install an arm64 Python"),
    ("intel_mac", "mps", "Intel Mac"),
    ("m1_macos13_torch2.14", "mps", "torch<2.9"),
    ("linux_gpu_cpu_torch", "cuda", "CPU-only build"),
])
def test_explicit_device_the_machine_lacks_is_refused(machine, device, expected):
    message = refusal(machine, device=device)
    assert expected in message
    assert "--cpu" in message  # says what to do


def test_explicit_device_in_profile_is_refused_too():
    assert "the profile asks for mps" in refusal("linux_cpu", Profile(device="mps"))


def test_flag_beats_profile():
    plan = plan_for("linux_8gpu", Profile(device="cpu", mixed_precision="bf16", num_processes=2),
                    device="cuda", mixed_precision="fp16", num_processes=1)
    assert (plan.device, plan.settings.mixed_precision, plan.settings.num_processes) == \
        ("cuda", "fp16", 1)


def test_profile_beats_auto_detection():
    plan = plan_for("m2_macos15", Profile(device="cpu"))
    assert plan.device == "cpu"
    assert "profile" in plan.reason


def test_cpu_and_another_device_contradict():
    assert "contradict" in refusal("m1_macos14", cpu=True, device="mps")


def test_flag_values_are_checked_like_profile_keys():
    assert "--num_processes must be 1 or more" in refusal("linux_cpu", num_processes=0)
    assert "--main_process_port" in refusal("linux_cpu", main_process_port=70000)


# ---------------------------------------------------------------- mixed precision

@pytest.mark.parametrize("machine, flags, expected", [
    ("linux_cpu", {"mixed_precision": "fp16"}, "bf16 on cpu"),
    ("m1_macos14", {"mixed_precision": "fp16", "cpu": True}, "bf16 on cpu"),
    ("m1_macos12_torch2.4", {"mixed_precision": "fp16"}, "torch 2.8 or later"),
    ("m3_macos15_torch2.5", {"mixed_precision": "bf16"}, "torch 2.6 or later"),
    ("m1_macos13_torch2.8", {"mixed_precision": "bf16"}, "macOS 14 or later"),
])
def test_unsupported_precision_is_refused_before_launch(machine, flags, expected):
    assert expected in refusal(machine, **flags)


@pytest.mark.parametrize("machine, flags", [
    ("linux_cpu", {"mixed_precision": "bf16"}),
    ("m1_macos14", {"mixed_precision": "bf16"}),
    ("m2_macos15", {"mixed_precision": "fp16"}),
    ("m1_macos13_torch2.8", {"mixed_precision": "fp16"}),
    ("linux_1gpu", {"mixed_precision": "fp16"}),
    ("linux_1gpu", {"mixed_precision": "bf16"}),
])
def test_supported_precision_passes_to_the_child(machine, flags):
    plan = plan_for(machine, **flags)
    assert plan.env["ACCELERATE_MIXED_PRECISION"] == flags["mixed_precision"]
    assert plan.env["MPSLAUNCH_MIXED_PRECISION"] == flags["mixed_precision"]


# ---------------------------------------------------------------- processes

@pytest.mark.parametrize("machine", ["m1_macos14", "m2_macos15", "m1_macos13_torch2.8"])
@pytest.mark.parametrize("how", [{"num_processes": 2}, {"num_machines": 2, "main_process_ip": "10.0.0.1"}])
def test_several_processes_on_mps_are_refused(machine, how):
    message = refusal(machine, **how)
    assert "gloo" in message and "mps" in message
    assert "--cpu --num_processes" in message


def test_several_processes_on_mps_from_a_profile_are_refused():
    assert "cannot train on mps" in refusal("m2_macos15", Profile(num_processes=4))


def test_several_cpu_processes_on_a_mac_run_through_torchrun():
    plan = plan_for("m2_macos15", cpu=True, num_processes=4)
    assert (plan.device, plan.engine, plan.settings.num_processes) == ("cpu", "torchrun", 4)
    assert plan.env["OMP_NUM_THREADS"] == "3"  # 12 cores shared by 4 processes
    assert "ACCELERATE_TORCH_DEVICE" not in plan.env


def test_user_omp_num_threads_is_kept():
    plan = plan_for("linux_cpu", None, {"OMP_NUM_THREADS": "7"}, cpu=True, num_processes=2)
    assert "OMP_NUM_THREADS" not in plan.env


def test_cuda_processes_are_one_per_gpu():
    plan = plan_for("linux_8gpu", num_processes=8)
    assert (plan.device, plan.engine, plan.world_size) == ("cuda", "torchrun", 8)
    assert "ACCELERATE_TORCH_DEVICE" not in plan.env  # each rank picks its own GPU
    assert plan.env["OMP_NUM_THREADS"] == "1"  # torchrun's own default for GPU ranks
    assert "2 NVIDIA GPUs are visible" not in refusal("linux_1gpu", num_processes=2)
    assert "1 NVIDIA GPU is visible" in refusal("linux_1gpu", num_processes=2)


def test_more_cpu_processes_than_cores_is_a_warning_not_an_error():
    plan = plan_for("linux_cpu", cpu=True, num_processes=4)
    assert plan.warnings and "share 2 CPU cores" in plan.warnings[0]


def test_far_more_cpu_processes_than_cores_is_refused():
    assert plan_for("linux_cpu", cpu=True, num_processes=8).settings.num_processes == 8
    assert "use at most 8" in refusal("linux_cpu", cpu=True, num_processes=9)
    assert "use at most 8" in refusal("linux_cpu", cpu=True, num_processes=60_000)


def test_several_machines_need_the_main_address():
    assert "main_process_ip" in refusal("linux_8gpu", num_machines=2)
    assert "machine_rank 2 must be below" in refusal(
        "linux_8gpu", num_machines=2, machine_rank=2, main_process_ip="10.0.0.1")


# ---------------------------------------------------------------- the child's environment

def test_mps_fallback_is_set_before_the_child_starts():
    assert plan_for("m1_macos14").env["PYTORCH_ENABLE_MPS_FALLBACK"] == "1"
    assert plan_for("m1_macos14", Profile(mps_fallback=False)).env["PYTORCH_ENABLE_MPS_FALLBACK"] == "0"


def test_users_own_mps_fallback_setting_is_kept():
    plan = plan_for("m1_macos14", environ={"PYTORCH_ENABLE_MPS_FALLBACK": "0"})
    assert "PYTORCH_ENABLE_MPS_FALLBACK" not in plan.env  # theirs passes through untouched


def test_no_mps_variables_off_mps():
    assert not any(key.startswith("PYTORCH_") for key in plan_for("linux_cpu").env)


@pytest.mark.parametrize("cap, environ, high, low", [
    (1.0, {}, "1", "0.8235"),  # low scaled so that low <= high, keeping torch's 1.4/1.7 proportion
    (1.6, {}, "1.6", None),  # the default low (1.4) already fits
    (0.0, {}, "0.0", None),  # no limit: any low up to 2.0 is accepted by torch
    (None, {"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "0.5"}, None, "0.4118"),  # user set only high
    (1.0, {"PYTORCH_MPS_LOW_WATERMARK_RATIO": "0.3"}, "1", None),  # user's low fits: kept
])
def test_watermarks_stay_consistent(cap, environ, high, low):
    env = plan_for("m1_macos14", Profile(mps_memory_cap=cap), environ).env
    assert env.get("PYTORCH_MPS_HIGH_WATERMARK_RATIO") == high
    assert env.get("PYTORCH_MPS_LOW_WATERMARK_RATIO") == low


def test_only_values_the_plan_changes_count_as_replaced():
    environ = {"ACCELERATE_MIXED_PRECISION": "fp16", "ACCELERATE_USE_CPU": "true",
               "OMP_NUM_THREADS": "3"}
    plan = plan_for("linux_cpu", environ=environ, cpu=True, num_processes=2)
    assert plan.replaced == {"ACCELERATE_MIXED_PRECISION": "fp16"}  # the same value is no change
    assert plan.env["ACCELERATE_MIXED_PRECISION"] == "no"
    assert "OMP_NUM_THREADS" not in plan.env  # a default only: the user's value stays


@pytest.mark.parametrize("environ, expected", [
    ({"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "0.5", "PYTORCH_MPS_LOW_WATERMARK_RATIO": "0.9"}, "above the high"),
    ({"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "lots"}, "must be a number"),
    ({"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "3"}, "from 0.0 to 2.0"),
])
def test_inconsistent_user_watermarks_are_refused(environ, expected):
    assert expected in refusal("m1_macos14", environ=environ)


def test_child_command_keeps_script_arguments_untouched():
    plan = plan_for("linux_cpu")
    assert plan.command == ("python3", "train.py", "--lr", "0.1")
    module_plan = resolve(Profile(), LaunchRequest("pkg.train", ("--cpu",), module=True), MACHINES["linux_cpu"], {})
    assert module_plan.command == ("python3", "-m", "pkg.train", "--cpu")


def test_summary_and_dry_run_text():
    plan = plan_for("m1_macos14", mixed_precision="bf16")
    assert plan.summary() == ("mpslaunch: mps: Apple M1, macOS 14.5, torch 2.14.1; precision bf16; "
                              "1 process; kept awake while it runs")
    text = plan.describe()
    assert "PYTORCH_ENABLE_MPS_FALLBACK=1" in text and "command:         python3 train.py --lr 0.1" in text


# ---------------------------------------------------------------- several GPUs by default

@pytest.mark.parametrize("machine, processes", [("linux_2gpu", 2), ("linux_8gpu", 8)])
def test_auto_uses_every_visible_gpu(machine, processes):
    plan = plan_for(machine)
    assert (plan.device, plan.settings.num_processes, plan.engine) == ("cuda", processes, "torchrun")
    assert plan.env["MPSLAUNCH_NUM_PROCESSES"] == str(processes)
    assert "ACCELERATE_TORCH_DEVICE" not in plan.env  # it would put every rank on one GPU
    assert plan.summary().endswith(f"; {processes} processes, one per GPU (--num_processes 1 for one)")
    assert f"{processes} per machine (one per visible GPU, default), 1 machine (default)" \
        in plan.describe()
    assert plan_for(machine, Profile(device="cuda")).settings.num_processes == processes


@pytest.mark.parametrize("machine", ["linux_2gpu", "linux_8gpu"])
def test_one_process_on_several_gpus_when_asked(machine):
    for plan in (plan_for(machine, num_processes=1), plan_for(machine, Profile(num_processes=1))):
        assert (plan.settings.num_processes, plan.engine) == (1, "single")
        assert plan.env["ACCELERATE_TORCH_DEVICE"] == "cuda"
        assert "one per GPU" not in plan.summary()
    explicit = plan_for(machine, Profile(num_processes=2), num_processes=None)
    assert explicit.settings.num_processes == 2 and "one per GPU" not in explicit.summary()
    assert plan_for(machine, cpu=True).settings.num_processes == 1


@pytest.mark.parametrize("machine", ["linux_1gpu", "linux_cpu", "m1_macos14", "m2_macos15", "intel_mac",
                                     "rosetta", "linux_gpu_cpu_torch"])
def test_one_gpu_macs_and_cpus_keep_one_process(machine):
    plan = plan_for(machine)
    assert (plan.settings.num_processes, plan.engine) == (1, "single")
    assert plan.choice().endswith("; 1 process")


# ---------------------------------------------------------------- Accelerate's launch options

def test_gpu_ids_narrow_the_plan_and_reach_the_ranks():
    plan = plan_for("linux_8gpu", gpu_ids="1,3")
    assert (plan.settings.num_processes, plan.engine) == (2, "torchrun")
    assert "cuda: 2 x NVIDIA H200" in plan.reason
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert "--gpu_ids 1,3: CUDA_VISIBLE_DEVICES=1,3" in plan.describe()
    assert plan_for("linux_8gpu", Profile(gpu_ids="all")).settings.num_processes == 8
    assert "CUDA_VISIBLE_DEVICES" not in plan_for("linux_8gpu", gpu_ids="all").env


@pytest.mark.parametrize("gpu_ids, environ, expected", [
    ("2", {}, "numbers 0 to 1"),
    ("0,0", {}, "or one twice"),
    ("0", {"CUDA_VISIBLE_DEVICES": "1"}, "both choose GPUs"),
])
def test_impossible_gpu_ids_are_refused(gpu_ids, environ, expected):
    assert expected in refusal("linux_2gpu", environ=environ, gpu_ids=gpu_ids)
    assert "must be GPU numbers" in refusal("linux_2gpu", gpu_ids="0, 1")


def test_gpu_ids_off_cuda_are_named_as_having_no_effect():
    plan = plan_for("m4_macos15", gpu_ids="0")
    assert plan.device == "mps" and "CUDA_VISIBLE_DEVICES" not in plan.env
    assert plan.warnings == ("--gpu_ids 0 has no effect on mps",)


def test_multi_gpu_is_a_check_of_the_plan():
    plan = plan_for("linux_2gpu", multi_gpu=True)
    assert plan.settings.num_processes == 2 and "--multi_gpu: checked" in plan.describe()
    for machine, flags in (("linux_1gpu", {}), ("linux_2gpu", {"num_processes": 1}),
                           ("m2_macos15", {}), ("linux_2gpu", {"cpu": True})):
        assert "--multi_gpu asks for several GPUs" in refusal(machine, multi_gpu=True, **flags)


def test_accelerate_settings_become_its_variables():
    plan = plan_for("linux_cpu", Profile(dynamo_backend="inductor", dynamo_mode="max-autotune"),
                    debug=True, dynamo_use_fullgraph=True, num_cpu_threads_per_process=3)
    assert {key: plan.env[key] for key in plan.env if key.startswith("ACCELERATE_D")} == {
        "ACCELERATE_DYNAMO_BACKEND": "INDUCTOR", "ACCELERATE_DYNAMO_MODE": "max-autotune",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": "True", "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "False", "ACCELERATE_DEBUG_MODE": "true"}
    assert plan.env["OMP_NUM_THREADS"] == "3"
    text = plan.describe()
    assert "dynamo_backend: inductor in the profile: ACCELERATE_DYNAMO_BACKEND=INDUCTOR" in text
    assert "--debug: ACCELERATE_DEBUG_MODE=true" in text
    assert "ACCELERATE_DYNAMO_BACKEND" not in plan_for("linux_cpu").env


@pytest.mark.parametrize("flags, expected", [
    ({"no_python": True, "module": True}, "cannot be used together"),
    ({"num_cpu_threads_per_process": 0}, "--num_cpu_threads_per_process must be 1 or more"),
    ({"monitor_interval": 0.0}, "--monitor_interval must be"),
    ({"tee": "9"}, "--tee must be one of 0, 1, 2, 3"),
    ({"dynamo_backend": "tpu"}, "--dynamo_backend must be one of"),
])
def test_bad_accelerate_option_values_are_refused(flags, expected):
    assert expected in refusal("linux_cpu", **flags)


def test_no_python_runs_the_target_itself():
    plan = plan_for("linux_cpu", no_python=True)
    assert plan.command == ("train.py", "--lr", "0.1")


def test_options_for_several_processes_are_named_with_one():
    plan = plan_for("linux_cpu", max_restarts=2, rdzv_backend="c10d", main_process_port=29500)
    assert plan.warnings == ("--max_restarts, --rdzv_backend, --main_process_port have no effect "
                             "with one process",)
    assert plan_for("linux_cpu", cpu=True, num_processes=2, max_restarts=2).warnings == ()
    assert plan_for("linux_cpu", Profile(max_restarts=3)).warnings == ()  # a profile's: not given here


def test_num_processes_per_machine_is_pointed_out_to_accelerate_users():
    plan = plan_for("linux_8gpu", num_processes=8, num_machines=2, main_process_ip="10.0.0.1")
    assert plan.warnings == ("--num_processes 8 counts this machine's processes (Accelerate's "
                             "counts every machine's): 16 in all",)


# ---------------------------------------------------------------- several machines

HOST = MACHINES["linux_cpu"]._replace(addresses=("127.0.0.1", "192.168.1.5", "::1"))
TWO_MACHINES = dict(cpu=True, num_machines=2, machine_rank=0)


@pytest.mark.parametrize("machine, flags", [
    (HOST, dict(main_process_ip="192.168.1.5")),
    (HOST, dict(main_process_ip="::1")),
    (HOST._replace(name_lookup=("trainer0", ("192.168.1.5",))), dict(main_process_ip="trainer0")),
    (HOST, dict(main_process_ip="10.0.0.5", main_process_ip_via_nat=True)),
    (HOST, dict(main_process_ip="10.0.0.5", machine_rank=1)),  # machine 0 is elsewhere
    (MACHINES["linux_cpu"], dict(main_process_ip="10.0.0.5")),  # addresses not probed: unchecked
], ids=["own-ip", "own-ipv6", "name-resolving-to-own", "nat", "machine-1", "not-probed"])
def test_machine_0_may_serve_on_its_own_address(machine, flags):
    plan = resolve(Profile(), LaunchRequest("train.py", **{**TWO_MACHINES, **flags}), machine, {})
    assert plan.settings.num_machines == 2


@pytest.mark.parametrize("machine, address, expected", [
    (HOST, "10.0.0.5", "main_process_ip 10.0.0.5 is not an address of this machine"),
    (HOST._replace(name_lookup=("elsewhere", ("10.0.0.5",))), "elsewhere", "elsewhere is not an address"),
    (HOST._replace(name_lookup=("nowhere", ())), "nowhere", "nowhere does not resolve"),
])
def test_machine_0_refuses_an_address_that_is_not_its_own(machine, address, expected):
    request = LaunchRequest("train.py", **TWO_MACHINES, main_process_ip=address)
    with pytest.raises(MpslaunchError) as refused:
        resolve(Profile(), request, machine, {})
    message = str(refused.value)
    assert expected in message and "(192.168.1.5)" in message and "--main_process_ip_via_nat" in message

