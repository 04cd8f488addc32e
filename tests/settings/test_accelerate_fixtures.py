"""Accelerate's own config files (tests/settings/accelerate_configs/), checked against Accelerate itself.

Each fixture is loaded by Accelerate's loader and launch-argument validation on a described
machine (torch told its CUDA GPU count), and the device, mixed precision and processes per
machine that `accelerate launch` would use are compared with mpslaunch's plan on the same
machine. Where mpslaunch differs on purpose, the difference is named in DIFFERENCES. Every file
mpslaunch refuses is refused in one line naming the key, exit 2, with no traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import MACHINES, run_cli, write_script
from mpslaunch import commands as cli, machine as machine_probe
from mpslaunch.settings import profile_files
from mpslaunch.output import MpslaunchError
from mpslaunch.machine import Machine
from mpslaunch.plan import resolve
from mpslaunch.settings import LaunchRequest

FIXTURES = Path(__file__).resolve().parent / "accelerate_configs"

# Each fixture mpslaunch plans, and the described machine it is checked on.
PLANNED = {
    "no_distributed_cpu": "linux_cpu",
    "no_distributed_cpu_bf16": "m2_macos15",
    "no_distributed_gpu": "linux_1gpu",
    "no_distributed_gpu_fp16": "linux_8gpu",
    "no_distributed_gpu_bf16_dynamo": "linux_1gpu",
    "no_distributed_gpu_numa": "linux_1gpu",
    "multi_cpu_2": "linux_cpu",
    "multi_cpu_2_bf16_dynamo": "linux_cpu",
    "multi_cpu_2_fp16": "linux_cpu",
    "multi_cpu_mpirun": "linux_cpu",
    "multi_gpu_2": "linux_8gpu",
    "multi_gpu_2_fp16_debug": "linux_2gpu",
    "multi_gpu_8_bf16_dynamo": "linux_8gpu",
    "multi_gpu_8_numa": "linux_8gpu",
    "multi_gpu_2_of_8_ids": "linux_8gpu",
    "two_machines_rank0_16_gpus": "linux_8gpu",
    "two_machines_rank1_c10d_4_gpus": "linux_2gpu",
    **{f"default_command_{p}": "m2_macos15" for p in ("no", "fp16", "bf16")},
    **{f"basic_{p}_0gpu": "linux_cpu" for p in ("no", "fp16", "bf16")},
    **{f"basic_{p}_1gpu": "linux_1gpu" for p in ("no", "fp16", "bf16")},
    **{f"basic_{p}_8gpu": "linux_8gpu" for p in ("no", "fp16", "bf16")},
    "hand_fp16_true": "linux_1gpu",
    "hand_use_mps_device": "m2_macos15",
    "hand_dynamo_backend_NO": "linux_8gpu",
    "hand_dynamo_backend_inductor": "linux_8gpu",
    "hand_num_processes_minus_1": "linux_8gpu",
    "hand_ipex_config": "linux_cpu",
    "hand_ipex_on": "linux_cpu",
    "hand_unquoted_no": "linux_1gpu",
    "hand_no_with_2_processes": "linux_8gpu",
    "hand_no_without_num_processes": "linux_8gpu",
}
# The Accelerate files that plan the same on a Mac as on Linux: checked there too.
ON_A_MAC = ("no_distributed_gpu", "no_distributed_gpu_fp16", "no_distributed_gpu_bf16_dynamo", "hand_fp16_true")

# Each fixture mpslaunch refuses, and the words naming the key.
REFUSED = {
    "deepspeed": "Accelerate's distributed_type DEEPSPEED cannot be translated",
    "fsdp": "Accelerate's distributed_type FSDP cannot be translated",
    "megatron_lm": "Accelerate's distributed_type MEGATRON_LM cannot be translated",
    "tpu": "Accelerate's distributed_type XLA cannot be translated",
    "fp8": "Accelerate's mixed_precision fp8 cannot be translated",
    "sagemaker": "Accelerate's compute_environment AMAZON_SAGEMAKER cannot be translated",
    **{f"multi_{kind}": f"Accelerate's distributed_type MULTI_{kind.upper()} cannot be translated"
       for kind in ("xpu", "hpu", "npu", "mlu", "sdaa", "musa", "neuron")},
    "multi_cpu_mpirun_2_machines": "Accelerate's mpirun_config cannot be translated",
    "hand_downcast_bf16_yes": "Accelerate's downcast_bf16 cannot be translated",
    "hand_tpu_name": "Accelerate's tpu_name cannot be translated",
    "hand_bad_distributed_type_list": "Accelerate's distributed_type must be one of NO, MULTI_CPU, "
                                      "MULTI_GPU, not a list",
    "hand_bad_distributed_type_mapping": "Accelerate's distributed_type must be one of NO, "
                                         "MULTI_CPU, MULTI_GPU, not a section",
    "hand_bad_dynamo_config_name": "Accelerate's dynamo_config must be a section of dynamo_* "
                                   "settings (dynamo_backend: INDUCTOR, ...), not 'inductor'",
    "hand_bad_dynamo_config_number": "Accelerate's dynamo_config must be a section",
}

# Where mpslaunch differs from `accelerate launch` on purpose: fixture -> (Accelerate's outcome,
# mpslaunch's, why). An outcome is (device, mixed precision, processes per machine), or the
# start of the error it stops with.
MULTI_CPU_PROCESSES = ("accelerate launch starts one process for MULTI_CPU unless mpirun starts "
                       "them; mpslaunch starts num_processes through torch.distributed.run")
FP16_ON_CPU = "fp16 on cpu is refused: Accelerate would train in fp32 without a word"
DIFFERENCES = {
    "multi_cpu_2": (("cpu", "no", 1), ("cpu", "no", 2), MULTI_CPU_PROCESSES),
    "multi_cpu_2_bf16_dynamo": (("cpu", "bf16", 1), ("cpu", "bf16", 2), MULTI_CPU_PROCESSES),
    "multi_cpu_2_fp16": (("cpu", "fp16", 1), "fp16 mixed precision does not run on cpu",
                         f"{MULTI_CPU_PROCESSES}; {FP16_ON_CPU}"),
    "basic_fp16_0gpu": (("cpu", "fp16", 1), "fp16 mixed precision does not run on cpu", FP16_ON_CPU),
    "default_command_fp16": (("cpu", "fp16", 1), "fp16 mixed precision does not run on cpu",
                             FP16_ON_CPU),
    "hand_num_processes_minus_1": ("You need to manually pass in `--num_processes`", ("cuda", "bf16", 8),
                                   "num_processes -1 leaves the count to the launch command: "
                                   "mpslaunch's default, one process per GPU"),
    "hand_use_mps_device": ("The config file at", ("mps", "no", 1),
                            "Accelerate 1.15 no longer knows use_mps_device; mpslaunch reads it "
                            "as the Accelerate that wrote it meant it"),
    "hand_ipex_config": ("The config file at", ("cpu", "no", 1),
                         "Accelerate 1.15 no longer knows ipex_config; off, it changes nothing"),
    "hand_ipex_on": ("The config file at", ("cpu", "bf16", 1),
                     "Accelerate 1.15 no longer knows ipex_config; on, it only tunes speed and "
                     "is left out with a warning"),
    "hand_unquoted_no": ("'bool' object has no attribute 'lower'", ("cuda", "no", 1),
                         "Accelerate's launcher fails on YAML's false for mixed_precision and "
                         "dynamo_backend; mpslaunch reads false as Accelerate's 'no'"),
}

# The translation's one-line warnings: fixture -> words of each.
WARNINGS = {
    "no_distributed_gpu_numa": ["enable_cpu_affinity is left out (it only tunes speed)"],
    "multi_gpu_8_numa": ["enable_cpu_affinity is left out (it only tunes speed)"],
    "multi_cpu_mpirun": ["mpirun_config: the processes run on this machine through "
                         "torch.distributed.run, not mpirun (its hostfile '/etc/mpi-hostfile' is not read)"],
    "hand_ipex_on": ["ipex_config is left out"],
    "hand_no_with_2_processes": ["distributed_type NO is one process, as `accelerate launch` runs it, "
                                 "so num_processes 2 is not used"],
}


def fixture(name: str) -> Path:
    return FIXTURES / f"{name}.yaml"


def test_every_fixture_is_checked():
    names = {path.stem for path in FIXTURES.glob("*.yaml")}
    assert names == set(PLANNED) | set(REFUSED)
    assert not set(PLANNED) & set(REFUSED)
    assert set(DIFFERENCES) | set(WARNINGS) | set(ON_A_MAC) <= set(PLANNED)


def test_each_fixture_says_how_it_was_made():
    for path in FIXTURES.glob("*.yaml"):
        first = path.read_text().splitlines()[0]
        assert first.startswith(("# written by ", "# hand-written: ")), path.name


# ---------------------------------------------------------------- what accelerate launch does


def accelerate_device(machine: Machine) -> str:
    """The device Accelerate's PartialState picks where the config does not say cpu."""
    if machine.cuda_devices and machine.torch_cuda:
        return "cuda"
    if machine.is_mac and machine.mps_answer is not None and machine.mps_answer.usable:
        return "mps"
    return "cpu"


def accelerate_launch(path: Path, machine: Machine, monkeypatch):
    """(device, mixed precision, processes per machine) as `accelerate launch --config_file PATH`
    would start them on `machine`, from Accelerate's own parser, validation and launcher setup;
    or the error message it stops with."""
    import torch
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import launch as accelerate_launchers

    gpus = len(machine.cuda_devices) if machine.torch_cuda else 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    # Open MPI, as `mpirun --version` would name it on a machine that has it.
    monkeypatch.setattr(accelerate_launchers, "_get_mpirun_args",
                        lambda: ("mpirun", "--hostfile", "-n", "--npernode", "--bind-to"))
    monkeypatch.setattr(accelerate_launchers, "is_port_in_use", lambda port: False)
    try:
        args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
        args, _, _ = _validate_launch_command(args)
        if args.multi_gpu and not args.cpu:  # launch_command's choice: torch.distributed.run
            env = accelerate_launchers.prepare_multi_gpu_env(args)
            return "cuda", env["ACCELERATE_MIXED_PRECISION"], int(args.nproc_per_node)
        command, env = accelerate_launchers.prepare_simple_launcher_cmd_env(args)
    except (ValueError, AttributeError) as error:
        return str(error)
    processes = int(command[command.index("--npernode") + 1]) if command[0] == "mpirun" else 1
    device = "cpu" if env["ACCELERATE_USE_CPU"] == "True" else accelerate_device(machine)
    return device, env["ACCELERATE_MIXED_PRECISION"], processes


def mpslaunch_plan(path: Path, machine: Machine):
    """(device, mixed precision, processes per machine) of mpslaunch's plan, or its error."""
    try:
        plan = resolve(profile_files.read(path), LaunchRequest("train.py"), machine, {})
    except MpslaunchError as error:
        return str(error)
    return plan.device, plan.settings.mixed_precision, plan.settings.num_processes


def same_or_named(name: str, theirs, ours) -> None:
    if name not in DIFFERENCES:
        assert ours == theirs, name
        return
    expected_theirs, expected_ours, why = DIFFERENCES[name]
    assert why
    for expected, got in ((expected_theirs, theirs), (expected_ours, ours)):
        if isinstance(expected, str):
            assert isinstance(got, str) and expected in got, (name, got)
        else:
            assert got == expected, (name, got)


@pytest.mark.parametrize("name", sorted(PLANNED))
def test_planned_as_accelerate_launch_runs_it(name, monkeypatch):
    machine = MACHINES[PLANNED[name]]
    same_or_named(name, accelerate_launch(fixture(name), machine, monkeypatch),
                  mpslaunch_plan(fixture(name), machine))


@pytest.mark.parametrize("name", ON_A_MAC)
def test_planned_on_a_mac_as_accelerate_launch_runs_it(name, monkeypatch):
    """use_cpu false on a Mac: both train on mps with the file's precision."""
    machine = MACHINES["m2_macos15"]
    theirs = accelerate_launch(fixture(name), machine, monkeypatch)
    assert theirs[0] == "mps"
    assert mpslaunch_plan(fixture(name), machine) == theirs


@pytest.mark.parametrize("name", sorted(set(REFUSED) - {n for n in REFUSED if n.startswith("hand_bad")}))
def test_refused_files_are_files_accelerate_reads(name):
    """The refused fixtures are real Accelerate configs (only the broken ones are not)."""
    from accelerate.commands.config.config_args import load_config_from_file

    if name == "sagemaker":  # Accelerate 1.15 adds num_processes to its own file, then rejects it
        with pytest.raises(ValueError, match=r"unknown keys \(\['num_processes'\]\)"):
            load_config_from_file(str(fixture(name)))
        return
    assert load_config_from_file(str(fixture(name))) is not None


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_in_one_line_naming_the_key(name):
    with pytest.raises(MpslaunchError) as caught:
        profile_files.read_accelerate(fixture(name))
    message = str(caught.value)
    assert "\n" not in message and str(fixture(name)) in message
    assert REFUSED[name] in message


@pytest.mark.parametrize("name", sorted(PLANNED))
def test_warnings_are_one_line_each_and_only_where_expected(name):
    translation = profile_files.read_accelerate(fixture(name))
    expected = WARNINGS.get(name, [])
    assert len(translation.warnings) == len(expected), translation.warnings
    for words, warning in zip(expected, translation.warnings):
        assert words in warning and "\n" not in warning and str(fixture(name)) in warning


# ---------------------------------------------------------------- through the CLI


def described(monkeypatch, machine: Machine) -> None:
    """The CLI's probe answers for `machine`; machine 0 owns the main address 10.0.0.1."""
    monkeypatch.setattr(machine_probe, "probe", lambda: machine)
    monkeypatch.setattr(machine_probe, "with_addresses", lambda m, ip: m._replace(
        addresses=("127.0.0.1", "10.0.0.1")))


@pytest.mark.parametrize("name", sorted(PLANNED))
def test_cli_imports_and_plans_each_planned_file(name, tmp_path, monkeypatch, capsys):
    machine = MACHINES[PLANNED[name]]
    described(monkeypatch, machine)
    script = write_script(tmp_path, "train.py", "")
    ours = mpslaunch_plan(fixture(name), machine)
    code = cli.main(["launch", "--dry-run", "--config_file", str(fixture(name)), str(script)])
    out, err = capsys.readouterr()
    if isinstance(ours, str):  # refused at plan time, as resolve refuses it
        assert code == 2 and err.count("\n") == 1 and ours in err
    else:
        assert code == 0, err
        device, precision, processes = ours
        read_as = f"(Accelerate config {fixture(name)})"
        assert f"device:          {device} {read_as}\n" in out or \
            f"device:          {device} (auto, Accelerate config {fixture(name)})\n" in out
        assert f"mixed precision: {precision} {read_as}\n" in out
        assert f"processes:       {processes} per machine (" in out
        assert f"mpslaunch: note: {fixture(name)} was read as an Accelerate config file" in err
        for words in WARNINGS.get(name, []):
            assert f"mpslaunch: warning: {fixture(name)}: " in err and words in err
    code = cli.main(["config", "--from-accelerate", str(fixture(name)), "--default",
                     "--config_file", str(tmp_path / "imported.yaml")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err and all(words in err for words in WARNINGS.get(name, []))
    imported = profile_files.load(tmp_path / "imported.yaml")
    assert not isinstance(ours, tuple) or resolve(imported, LaunchRequest("train.py"), machine, {}) \
        .settings.num_processes == ours[2]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_cli_refuses_each_refused_file_in_one_line(name, tmp_path, monkeypatch, capsys):
    described(monkeypatch, MACHINES["linux_8gpu"])
    script = write_script(tmp_path, "train.py", "")
    for argv in (["launch", "--dry-run", "--config_file", str(fixture(name)), str(script)],
                 ["config", "--from-accelerate", str(fixture(name)), "--default", "--config_file",
                  str(tmp_path / "imported.yaml")],
                 ["config", "show", "--config_file", str(fixture(name))]):
        assert cli.main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and err.startswith("mpslaunch: error: ") and REFUSED[name] in err
    assert not (tmp_path / "imported.yaml").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hand_bad_distributed_type_list", "hand_bad_dynamo_config_name",
                                  "multi_cpu_mpirun_2_machines", "deepspeed"])
def test_refusals_through_the_real_cli(name, tmp_path):
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    for args in (("launch", "--config_file", str(fixture(name)), str(script)),
                 ("config", "--from-accelerate", str(fixture(name)), "--config_file",
                  str(tmp_path / "imported.yaml")),
                 ("config", "show", "--config_file", str(fixture(name)))):
        done = run_cli(*args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert REFUSED[name] in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "train.py.ran").exists() and not (tmp_path / "imported.yaml").exists()


@pytest.mark.slow
def test_warnings_reach_the_user_through_the_real_cli(tmp_path):
    path = fixture("hand_no_with_2_processes")
    script = write_script(tmp_path, "train.py", "")
    warning = (f"mpslaunch: warning: {path}: distributed_type NO is one process, as `accelerate "
               "launch` runs it, so num_processes 2 is not used")
    dry = run_cli("launch", "--dry-run", "--cpu", "--mixed_precision", "bf16", "--config_file", str(path),
                  str(script))
    assert dry.returncode == 0, dry.stderr
    assert warning in dry.stderr and "processes:       1 per machine" in dry.stdout
    imported = run_cli("config", "--from-accelerate", str(path), "--config_file", str(tmp_path / "p.yaml"))
    assert imported.returncode == 0, imported.stderr
    assert warning in imported.stderr and profile_files.load(tmp_path / "p.yaml").num_processes == 1
    shown = run_cli("config", "show", "--config_file", str(path))
    assert f"# warning: {path}: distributed_type NO is one process" in shown.stdout


@pytest.mark.slow
def test_multi_cpu_runs_one_process_under_accelerate_launch(tmp_path):
    """The MULTI_CPU difference, seen in a real `accelerate launch`: one process, no WORLD_SIZE."""
    import os
    import subprocess
    import sys

    script = write_script(tmp_path, "probe.py", "import os\nprint('WORLD_SIZE', os.environ.get('WORLD_SIZE'))\n")
    accelerate = Path(sys.executable).with_name("accelerate")
    if not accelerate.exists():
        pytest.skip("the accelerate command is not installed beside this Python")
    done = subprocess.run([str(accelerate), "launch", "--config_file", str(fixture("multi_cpu_2")),
                           str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines().count("WORLD_SIZE None") == 1, done.stdout


def _processes_planned():
    import os

    return os.environ["MPSLAUNCH_NUM_PROCESSES"]


def test_warnings_reach_the_python_api(capsys):
    import mpslaunch

    result = mpslaunch.launch(_processes_planned, config_file=str(fixture("hand_no_with_2_processes")),
                              cpu=True, mixed_precision="bf16", quiet=True)
    assert result == "1"  # one process: the function ran here
    assert (f"mpslaunch: warning: {fixture('hand_no_with_2_processes')}: distributed_type NO is one "
            "process") in capsys.readouterr().err
