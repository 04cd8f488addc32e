"""`accelerate launch`'s options through `mpslaunch launch`: taken with the same meaning, or
refused in one line that says the mpslaunch way. The list comes from the installed Accelerate."""

from __future__ import annotations

import json

import pytest

from helpers import run_cli, write_script
from mpslaunch import commands as cli


def launch_parser():
    return cli.build_parser("launch").command_parser


def test_every_accelerate_launch_option_is_taken_or_refused():
    from accelerate.commands.launch import launch_command_parser

    ours = launch_parser()._option_string_actions
    theirs = [name for action in launch_command_parser()._actions for name in action.option_strings]
    assert len(theirs) > 200
    assert [name for name in theirs if name not in ours] == []


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (["--use_fsdp"], "Accelerator(fsdp_plugin="),
    (["--zero-stage", "2"], "Accelerator(deepspeed_plugin="),
    (["--tpu"], "use `accelerate launch` on a TPU machine"),
    (["--fp8_backend", "te"], "mixed precision is no, fp16 or bf16"),
    (["--mpirun_hostfile", "hosts"], "--cpu --num_processes N"),
])
def test_accelerate_options_mpslaunch_does_not_take_say_what_to_do(tmp_path, args, words):
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    done = run_cli("launch", *args, str(script))
    assert done.returncode == 2 and done.stdout == ""
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"mpslaunch: error: {args[0]} is an accelerate launch option") and words in line
    assert not (tmp_path / "train.py.ran").exists()


@pytest.mark.slow
def test_accelerate_options_reach_an_unmodified_accelerator(tmp_path):
    script = write_script(tmp_path, "acc.py", """
import json, os, torch
from accelerate import Accelerator
accelerator = Accelerator()
print(json.dumps({"dynamo": accelerator.state.dynamo_plugin.backend.value, "debug": accelerator.state.debug,
                  "threads": torch.get_num_threads(), "omp": os.environ["OMP_NUM_THREADS"]}))
""")
    done = run_cli("launch", "--cpu", "-q", "--dynamo_backend", "eager", "--debug",
                   "--num_cpu_threads_per_process", "1", "-t", "3", "--monitor-interval", "2", str(script))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"dynamo": "EAGER", "debug": True, "threads": 1, "omp": "1"}
    assert "mpslaunch: warning: --monitor_interval has no effect with one process" in done.stderr


@pytest.mark.slow
def test_no_python_runs_an_executable_on_every_path(tmp_path):
    single = run_cli("launch", "--cpu", "-q", "--no_python", "/bin/sh", "-c", "echo device=$MPSLAUNCH_DEVICE")
    assert (single.returncode, single.stdout) == (0, "device=cpu\n"), single.stderr
    several = run_cli("launch", "--cpu", "-q", "--num_processes", "2", "--no-python",
                      "/bin/sh", "-c", "echo rank=$RANK of $WORLD_SIZE")
    assert several.returncode == 0, several.stderr
    assert sorted(several.stdout.splitlines()) == ["[rank0] rank=0 of 2", "[rank1] rank=1 of 2"]


@pytest.mark.slow
def test_dry_run_says_what_each_option_became(tmp_path):
    script = write_script(tmp_path, "train.py", "")
    done = run_cli("launch", "--dry-run", "--cpu", "--num_processes", "2", "--monitor_interval", "5",
                   "--num_cpu_threads_per_process", "2", "--tee", "3", str(script))
    assert done.returncode == 0, done.stderr
    for line in ("accelerate option --num_cpu_threads_per_process 2: OMP_NUM_THREADS=2",
                 "accelerate option --monitor_interval 5: torch.distributed.run's --monitor-interval",
                 "accelerate option --tee 3: every rank's output always reaches the console"):
        assert line in done.stdout
    assert "--monitor-interval 5 " in done.stdout
