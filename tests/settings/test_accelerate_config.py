"""Accelerate config files, written by Accelerate's own writers, translated into profiles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from helpers import MACHINES, basic_config, cluster_config, run_cli
from mpslaunch.settings import accelerate_config, profile_files
from mpslaunch.output import MpslaunchError
from mpslaunch.plan import resolve
from mpslaunch.settings import LaunchRequest
from mpslaunch.settings import Profile


def translated(path: Path) -> accelerate_config.Translation:
    translation = profile_files.read_accelerate(path)
    assert translation is not None
    assert profile_files.load(path) == translation.profile  # any command reads it the same way
    return translation


def refusal(path: Path) -> str:
    with pytest.raises(MpslaunchError) as caught:
        profile_files.read_accelerate(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    return message


def test_accelerate_config_default_on_a_mac(tmp_path, monkeypatch):
    path = basic_config(tmp_path, "bf16", monkeypatch)
    assert json.loads(path.read_text())["use_cpu"] is True  # JSON, in a .yaml file
    translation = translated(path)
    assert translation.profile == Profile(device="cpu", mixed_precision="bf16", num_processes=1)
    assert translation.basic_cpu


@pytest.mark.parametrize("as_json", [False, True], ids=["yaml", "json"])
def test_several_gpus_with_dynamo_and_debug(tmp_path, as_json):
    path = cluster_config(tmp_path / "acc.yaml", "MULTI_GPU", as_json, num_processes=4, mixed_precision="bf16",
                          gpu_ids="0,1,2,3", debug=True, main_process_port=None,
                          dynamo_config={"dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune",
                                         "dynamo_use_fullgraph": True})
    translation = translated(path)
    assert translation.profile == Profile(
        device="cuda", mixed_precision="bf16", num_processes=4, gpu_ids="0,1,2,3", debug=True,
        dynamo_backend="inductor", dynamo_mode="max-autotune", dynamo_use_fullgraph=True)
    assert not translation.basic_cpu
    plan = resolve(translation.profile, LaunchRequest("train.py"), MACHINES["linux_8gpu"], {})
    assert (plan.settings.num_processes, plan.env["CUDA_VISIBLE_DEVICES"]) == (4, "0,1,2,3")
    assert plan.env["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"


def test_num_processes_counts_every_machine_in_accelerate(tmp_path):
    path = cluster_config(tmp_path / "acc.yaml", "MULTI_GPU", num_processes=16, num_machines=2,
                          machine_rank=1, main_process_ip="10.0.0.1", main_process_port=29500,
                          rdzv_backend="c10d")
    assert translated(path).profile == Profile(
        device="cuda", num_processes=8, num_machines=2, machine_rank=1, main_process_ip="10.0.0.1",
        main_process_port=29500, rdzv_backend="c10d")


@pytest.mark.parametrize("distributed_type, use_cpu, device", [
    ("MULTI_CPU", False, "cpu"), ("NO", True, "cpu"), ("NO", False, "auto"), ("MULTI_GPU", False, "cuda"),
])
def test_devices(tmp_path, distributed_type, use_cpu, device):
    path = cluster_config(tmp_path / "acc.yaml", distributed_type, use_cpu=use_cpu, num_processes=1)
    assert translated(path).profile.device == device


def test_a_mac_answer_of_no_cpu_means_mps(tmp_path):
    path = cluster_config(tmp_path / "acc.yaml", "NO", num_processes=1, mixed_precision="fp16")
    plan = resolve(profile_files.load(path), LaunchRequest("train.py"), MACHINES["m2_macos15"], {})
    assert (plan.device, plan.settings.mixed_precision) == ("mps", "fp16")


@pytest.mark.parametrize("fields, words", [
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2}}, "distributed_type DEEPSPEED"),
    ({"distributed_type": "MULTI_GPU", "parallelism_config": {"parallelism_config_tp_size": 2}},
     "parallelism_config cannot be translated"),
    ({"distributed_type": "XLA"}, "use `accelerate launch` on a TPU machine"),
    ({"distributed_type": "MULTI_XPU"}, "distributed_type MULTI_XPU"),
    ({"distributed_type": "NO", "mixed_precision": "fp8"}, "mixed_precision fp8"),
    ({"distributed_type": "NO", "tpu_use_cluster": True}, "tpu_use_cluster cannot be translated"),
    ({"distributed_type": "MULTI_GPU", "num_processes": 3, "num_machines": 2, "main_process_ip": "h"},
     "cannot share it evenly"),
    ({"distributed_type": "MULTI_GPU", "rdzv_backend": "etcd"}, "rdzv_backend must be one of static, c10d"),
])
def test_what_cannot_map_is_refused_naming_the_key(tmp_path, fields, words):
    path = cluster_config(tmp_path / "acc.yaml", **fields)
    assert words in refusal(path)


@pytest.mark.parametrize("fields, words", [
    ({"fsdp_config": {"fsdp_version": 2}}, "fsdp_config is left out: distributed_type is MULTI_GPU, not FSDP"),
    ({"deepspeed_config": {"zero_stage": 2}}, "deepspeed_config is left out: distributed_type is MULTI_GPU"),
    ({"fp8_config": {"backend": "AO"}, "mixed_precision": "bf16"},
     "fp8_config is left out: mixed_precision is 'bf16', not fp8"),
])
def test_a_plugin_section_beside_another_distributed_type_is_left_out_with_a_warning(tmp_path, fields, words):
    """accelerate launch uses a plugin's section only with the plugin's distributed_type."""
    path = cluster_config(tmp_path / "acc.yaml", "MULTI_GPU", num_processes=2, **fields)
    translation = translated(path)
    assert translation.profile.device == "cuda" and translation.profile.num_processes == 2
    (warning,) = translation.warnings
    assert words in warning and "`accelerate launch` does not use it either" in warning


def test_sagemaker_and_unknown_keys_are_refused(tmp_path):
    from accelerate.commands.config.config_args import SageMakerConfig

    path = tmp_path / "sm.yaml"
    SageMakerConfig(compute_environment="AMAZON_SAGEMAKER", distributed_type="DATA_PARALLEL",
                    mixed_precision="no", use_cpu=False, debug=False, ec2_instance_type="ml.p3.2xlarge",
                    iam_role_name="role").to_yaml_file(path)
    assert "compute_environment AMAZON_SAGEMAKER" in refusal(path)
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: NO\nsomething_new: 1\n")
    assert "Accelerate's something_new cannot be translated" in refusal(path)


@pytest.mark.slow
def test_the_default_path_is_accelerates(tmp_path):
    variants = [{"HF_HOME": str(tmp_path / "hf")}, {"XDG_CACHE_HOME": str(tmp_path / "xdg")},
                {"HOME": str(tmp_path / "home")}]
    code = """
import importlib, json, os, sys
import accelerate.commands.config.config_args as config_args
found = []
for variant in json.loads(sys.argv[1]):
    for name in ("HF_HOME", "XDG_CACHE_HOME"):
        os.environ.pop(name, None)
    os.environ.update(variant)
    found.append(importlib.reload(config_args).default_config_file)
print(json.dumps(found))
"""
    done = subprocess.run([sys.executable, "-c", code, json.dumps(variants)], capture_output=True,
                          text=True, check=True)
    theirs = json.loads(done.stdout)
    ours = [str(accelerate_config.default_config_path({"HOME": str(tmp_path / "home"), **variant}))
            for variant in variants]
    assert ours == theirs


def test_older_and_hand_written_files(tmp_path):
    path = tmp_path / "acc.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: NO\nfp16: true\n"
                    "main_process_port: null\ndynamo_backend: EAGER\nuse_cpu: false\n")
    # distributed_type NO is one process, as `accelerate launch` runs it
    assert translated(path).profile == Profile(mixed_precision="fp16", dynamo_backend="eager",
                                               num_processes=1)


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 20) | st.floats(allow_nan=True) | st.text(max_size=12)
    | st.sampled_from(["NO", "no", "MULTI_GPU", "MULTI_CPU", "fp16", "INDUCTOR", "all", "main", ""]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["dynamo_backend", "dynamo_mode", "ipex", "mpirun_hostfile", "a"]), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(accelerate_config.KNOWN), _values, max_size=8))
def test_any_value_of_any_accelerate_key_is_translated_or_refused_in_one_line(config):
    """Wrong kinds of value (distributed_type: [1], dynamo_config: inductor, ...) never raise
    anything but mpslaunch's one-line error."""
    try:
        translation = accelerate_config.translate({"distributed_type": "NO", **config}, "acc.yaml")
    except MpslaunchError as error:
        assert "\n" not in str(error) and str(error).startswith("acc.yaml")
    else:
        assert all("\n" not in warning for warning in translation.warnings)


@pytest.mark.parametrize("off", [None, False, "no", "NO", "false", "", {}, [], [""], {"ipex": False}])
def test_off_values_are_idle_in_every_spelling(off):
    base = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "num_processes": 2}
    plain = accelerate_config.translate(base, "acc.yaml")
    for key in ("downcast_bf16", "tpu_env", "tpu_vm", "tpu_name", "commands", "deepspeed_config",
                "fsdp_config", "megatron_lm_config", "fp8_config", "parallelism_config", "mpirun_config",
                "enable_cpu_affinity", "ipex_config", "use_mps_device", "dynamo_config", "dynamo_backend"):
        assert accelerate_config.translate({**base, key: off}, "acc.yaml") == plain, key


@pytest.mark.slow
def test_what_accelerate_reads_is_read_a_tab_indented_json_file_and_a_quoted_port(tmp_path):
    fields = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_CPU",
              "mixed_precision": "no", "use_cpu": True, "num_processes": 2,
              "main_process_port": "29512", "gpu_ids": "all"}
    tabbed = tmp_path / "tabbed.json"  # Accelerate reads a .json file with json.load
    tabbed.write_text(json.dumps(fields, indent="\t"))
    profile = translated(tabbed).profile
    assert (profile.device, profile.num_processes, profile.main_process_port) == ("cpu", 2, 29512)
    quoted = tmp_path / "quoted.yaml"  # Accelerate passes the port on as text: '29512' works
    quoted.write_text("".join(f"{key}: {json.dumps(value)}\n" for key, value in fields.items()))
    assert translated(quoted).profile == profile
    (tmp_path / "x.py").write_text("print('ran')\n")
    for path in (tabbed, quoted):
        plan = run_cli("launch", "--dry_run", "--config_file", str(path), "x.py", cwd=tmp_path)
        assert plan.returncode == 0 and "29512" in plan.stdout, plan.stderr[-2000:]
    (tmp_path / "tabbed.yaml").write_text(tabbed.read_text())  # Accelerate's YAML reader refuses tabs
    assert "not valid YAML" in refusal(tmp_path / "tabbed.yaml")
