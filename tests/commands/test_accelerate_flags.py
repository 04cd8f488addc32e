"""`accelerate launch`'s options through `mpslaunch launch`: taken with the same meaning, or
refused in one line that says the mpslaunch way. The list comes from the installed Accelerate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import one_line_error, run_cli, write_script
from mpslaunch import commands as cli
from mpslaunch.commands import launch
from mpslaunch.commands.parser import _nearest
from mpslaunch.settings.accelerate_flags import REFUSED

REFUSED_SPELLINGS = [spelling for _, names in REFUSED for name in names
                     for spelling in (name, name.replace("_", "-"))]


def launch_parser():
    return cli.build_parser("launch").command_parser


def test_every_accelerate_launch_option_is_taken_or_refused():
    from accelerate.commands.launch import launch_command_parser

    ours = launch_parser()._option_string_actions
    theirs = [name for action in launch_command_parser()._actions for name in action.option_strings]
    assert len(theirs) > 200
    assert [name for name in theirs if name not in ours and not launch.explain_unknown(name)] == []


def test_a_refused_option_is_no_option_of_the_parser_and_each_spelling_says_its_way():
    ours = launch_parser()._option_string_actions
    assert len(REFUSED_SPELLINGS) > 190
    assert [spelling for spelling in REFUSED_SPELLINGS if spelling in ours] == []
    for why, names in REFUSED:
        for name in names:
            for typed in (name, name.replace("_", "-"), f"{name}=1"):
                spelling = typed.split("=")[0]
                assert launch.explain_unknown(typed) == (
                    f"{spelling} is an accelerate launch option mpslaunch does not take: {why}")
    for word in ("--tpu_", "--use_fsdp-", "-tpu", "tpu", "train.py", "--num_processes", "--"):
        assert launch.explain_unknown(word) is None


def test_the_nearest_option_is_never_a_refused_one():
    ours = launch_parser()._option_string_actions
    for spelling in REFUSED_SPELLINGS:
        for typo in (spelling[:-1], spelling + "s"):
            assert _nearest(typo, ours) not in REFUSED_SPELLINGS, typo


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


TPU = "--tpu is an accelerate launch option mpslaunch does not take: mpslaunch runs on mps, cuda"
FP8 = "accelerate launch option mpslaunch does not take: mpslaunch's mixed precision is no"


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (["--fp8_backend=te", "SCRIPT"], f"--fp8_backend is an {FP8}"),
    (["--fp8-backend", "te", "SCRIPT"], f"--fp8-backend is an {FP8}"),  # te is taken as the script
    (["--fp8_backend"], f"--fp8_backend is an {FP8}"),
    (["--tpu=yes", "SCRIPT"], TPU),
    (["--tpu"], TPU),  # no script
    (["--tpu", "-m", "json.tool"], TPU),
    (["-m", "--tpu", "json.tool"], TPU),
    # With another problem on the line, the first one is said.
    (["--bogus", "--tpu", "SCRIPT"], TPU),
    (["--tpu", "--bogus", "SCRIPT"], TPU),
    (["--tpu", "--num_processes", "many", "SCRIPT"], TPU),
    (["--tpu", "--main_process_ip"], TPU),
    (["--num_processes", "many", "--tpu", "SCRIPT"], "argument --num_processes: invalid int value"),
    (["--main_process_ip", "--tpu", "SCRIPT"], "argument --main_process_ip: expected one argument"),
    (["-t9", "SCRIPT", "--tpu"], "--tee must be one of 0, 1, 2, 3, not '9'"),  # --tpu: the script's
])
def test_a_refused_option_in_each_form_and_company_is_one_line(tmp_path, args, words):
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    line = one_line_error(run_cli("launch", *[str(script) if arg == "SCRIPT" else arg for arg in args]))
    assert line.startswith(f"mpslaunch: error: {words}")
    assert line.endswith("(see `mpslaunch launch --help`)")
    assert not (tmp_path / "train.py.ran").exists()


@pytest.mark.slow
def test_a_refused_option_before_the_command_is_refused_not_moved(tmp_path):
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    line = one_line_error(run_cli("--tpu", "launch", str(script)))
    assert line.startswith(f"mpslaunch: error: {TPU}") and "give it after" not in line
    assert not (tmp_path / "train.py.ran").exists()


@pytest.mark.slow
def test_a_misspelled_refused_option_is_unrecognized_and_not_suggested(tmp_path):
    script = write_script(tmp_path, "train.py", "")
    line = one_line_error(run_cli("launch", "--use_fsd", str(script)))
    assert line.startswith("mpslaunch: error: unrecognized arguments: --use_fsd")
    assert "did you mean --use_fsdp" not in line


@pytest.mark.slow
def test_refused_options_after_the_script_or_module_are_the_scripts(tmp_path):
    script = write_script(tmp_path, "train.py", "import sys; print(sys.argv[1:])\n")
    write_script(tmp_path, "tool.py", "import sys; print('module', sys.argv[1:])\n")
    done = run_cli("launch", "--cpu", "-q", str(script), "--tpu", "--fp8_backend", "te")
    assert (done.returncode, done.stdout) == (0, "['--tpu', '--fp8_backend', 'te']\n"), done.stderr
    done = run_cli("launch", "--cpu", "-q", "-m", "tool", "--use-fsdp", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "module ['--use-fsdp']\n"), done.stderr


@pytest.mark.slow
def test_help_lists_no_refused_option_and_a_launch_does_not_read_their_table(tmp_path):
    shown = run_cli("launch", "--help").stdout
    assert [spelling for spelling in REFUSED_SPELLINGS if f"{spelling} " in shown] == []
    script = write_script(tmp_path, "train.py", "")
    probe = ("import sys; from mpslaunch.commands import main; "
             f"code = main(['launch', '--dry_run', {str(script)!r}]); "
             "print(code, 'mpslaunch.settings.accelerate_flags' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "0 False", done.stderr


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
