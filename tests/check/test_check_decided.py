"""Through `mpslaunch check`, what the plan decides: the launcher's own variables (removed on one
process, torchrun's on several), an if/elif/else whose every branch stops, a statement that
always raises on the plan, loader workers from an option whose default is 0, files the project
writes itself (through a helper, or in a script beside the script), identifiers spelled as
Python folds them, and docs/check.md's example of all this."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from helpers import REPO, run_cli, write_script

pytestmark = pytest.mark.slow  # every test here starts processes

SCRIPTS = Path(__file__).parent / "scripts"


def findings(*args: str, cwd: Path | None = None, env: dict | None = None) -> set[tuple[str, int, str]]:
    """(file name, line, what it starts with) of each finding `mpslaunch check ARGS` prints."""
    result = run_cli("check", *args, cwd=cwd, env=env)
    assert result.returncode in (0, 1), result.stderr
    found = set()
    for line in result.stdout.splitlines()[:-1]:
        path, number, text = line.split(":", 2)
        found.add((Path(path).name, int(number), text.strip().split(" ")[0]))
    return found


def line_of(path: Path, text: str) -> int:
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line)


MAC = ("--device", "mps")
TWO_CPU_PROCESSES = ("--device", "cpu", "--num_processes", "2")


def test_a_rank_condition_is_decided_by_the_plan_not_by_this_shell():
    script = SCRIPTS / "rank_ddp.py"
    line = lambda text: line_of(script, text)  # noqa: E731
    # one process: mpslaunch removes another launcher's RANK, WORLD_SIZE, LOCAL_RANK, even when
    # this shell has them (a torchrun or SLURM job's): the ddp branch is never taken
    torchrun_shell = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    assert findings(*MAC, str(script), env=torchrun_shell) == {
        ("rank_ddp.py", line('torch.load("pretrained.pt")'), "torch.load")}
    # several processes: torchrun sets them, so the ddp branch runs and LOCAL_RANK is there
    assert findings(*TWO_CPU_PROCESSES, str(script)) == {
        ("rank_ddp.py", line("init_process_group(backend"), "init_process_group(\"nccl\")"),
        ("rank_ddp.py", line("torch.cuda.set_device(device)"), "torch.cuda.set_device()"),
        ("rank_ddp.py", line("torch.cuda.synchronize()"), "torch.cuda.synchronize()")}


def test_a_variable_the_script_sets_itself_is_not_the_plans(tmp_path):
    body = (SCRIPTS / "rank_ddp.py").read_text().replace(
        "ddp = int(", 'os.environ.setdefault("RANK", "0")\nos.environ.setdefault("LOCAL_RANK", "0")\nddp = int(')
    script = write_script(tmp_path, "sets_rank.py", body)
    rules = {text for _, _, text in findings(*MAC, str(script))}
    assert "torch.cuda.set_device()" in rules  # the script may have set RANK: the ddp branch is read
    assert "torch.cuda.set_device()" not in {text for _, _, text in findings(*MAC, str(SCRIPTS / "rank_ddp.py"))}


CHAIN_THAT_SETS_RANK = """\
import os
import torch


def init(args):
    if args.on_itp:
        args.rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ["RANK"] = str(args.rank)
    elif "RANK" in os.environ:
        args.rank = int(os.environ["RANK"])
    else:
        return
    torch.cuda.set_device(args.rank)


def later():
    if "RANK" in os.environ:
        torch.cuda.synchronize()
"""


def test_a_variable_set_in_a_branch_is_still_the_plans_in_the_tests_of_its_chain(tmp_path):
    # the chain's tests run before any of its branches: "RANK" in os.environ there is false on one
    # process (and OMPI_COMM_WORLD_RANK, removed too, stops the first branch); after the chain it
    # may be the script's own
    script = write_script(tmp_path, "itp.py", CHAIN_THAT_SETS_RANK + "init(None)\nlater()\n")
    assert findings(*MAC, str(script)) == {("itp.py", line_of(script, "torch.cuda.synchronize()"),
                                            "torch.cuda.synchronize()")}


def test_an_if_elif_else_whose_every_branch_stops_guards_the_rest():
    script = SCRIPTS / "exit_chain.py"
    set_device = line_of(script, "torch.cuda.set_device(args.gpu)")
    # on a Mac: no torchrun variables, SLURM's branch divides by torch.cuda.device_count() (0),
    # no CUDA, else sys.exit(1): set_device never runs; nor after `return` without LOCAL_RANK
    assert findings(*MAC, str(script)) == set()
    assert {line for _, line, _ in findings(*TWO_CPU_PROCESSES, str(script))} == {
        line_of(script, "dist.init_process_group"), set_device,
        line_of(script, 'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))')}


def test_a_loader_whose_workers_option_defaults_to_0_starts_none():
    script = SCRIPTS / "loader_option.py"
    # the loader of --dataloader_num_workers (default 0) pickles nothing; --eval_workers's (2) does
    assert findings(*MAC, str(script)) == {
        ("loader_option.py", line_of(script, "evaluation = DataLoader"), "collate_fn")}


PREPARE = "import torch\n\ntorch.save(torch.randn(64, 8), 'traindata.pt')\n"
TRAIN = "import torch\n\ndata = torch.load('traindata.pt')\nmodel = torch.nn.Linear(8, 2)\n"


def test_a_file_a_script_beside_it_writes_is_not_a_checkpoint_from_elsewhere(tmp_path):
    write_script(tmp_path, "train.py", TRAIN)
    assert findings(*MAC, "train.py", cwd=tmp_path) == {("train.py", 3, "torch.load")}
    write_script(tmp_path, "prepare.py", PREPARE)  # written on this machine: it loads here
    assert findings(*MAC, "train.py", cwd=tmp_path) == set()


def test_launch_notices_the_script_beside_it_that_writes_the_file(tmp_path):
    write_script(tmp_path, "train.py", TRAIN)

    def warnings() -> list[str]:
        result = run_cli("launch", "--dry-run", "--cpu", "train.py", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return [line for line in result.stderr.splitlines() if line.startswith("mpslaunch: warning: train.py")]

    assert len(warnings()) == 1
    write_script(tmp_path, "prepare.py", PREPARE)  # train.py is unchanged; its folder is not
    assert warnings() == []


def test_a_checkpoint_saved_through_a_helper_is_the_scripts_own(tmp_path):
    script = write_script(tmp_path, "train.py", (
        "import shutil\nimport torch\n\n\n"
        "def save_checkpoint(state, is_best, filename='checkpoint.pth.tar'):\n"
        "    torch.save(state, filename)\n"
        "    if is_best:\n        shutil.copyfile(filename, 'model_best.pth.tar')\n\n\n"
        "model = torch.nn.Linear(2, 2)\n"
        "save_checkpoint({'model': model.state_dict()}, True, filename='last.pth.tar')\n"
        "model.load_state_dict(torch.load('checkpoint.pth.tar')['model'])\n"
        "model.load_state_dict(torch.load('last.pth.tar')['model'])\n"
        "model.load_state_dict(torch.load('pretrained.pth.tar')['model'])\n"))
    assert findings(*MAC, str(script)) == {("train.py", line_of(script, "pretrained.pth.tar"), "torch.load")}


def test_identifiers_are_read_as_python_folds_them():
    script = SCRIPTS / "fullwidth.py"
    assert {(line, text) for _, line, text in findings(*MAC, str(script))} == {
        (line_of(script, "model.ｃｕｄａ()"), ".cuda()"), (line_of(script, "torch.ｌｏａｄ"), "torch.load"),
        (line_of(script, "torch.ｆｌｏａｔ６４"), "float64"), (line_of(script, "features.ｃｕｄａ()"), ".cuda()")}


def test_the_example_in_the_docs_finds_what_its_comments_say(tmp_path):
    text = (REPO / "docs" / "check.md").read_text().split("### Conditions the plan decides", 1)[1]
    example = re.findall(r"```python\n(.+?)\n```", text, re.DOTALL)[0]
    script = write_script(tmp_path, "example.py", example)
    marked = lambda words: {number for number, line in enumerate(example.splitlines(), 1)  # noqa: E731
                            if line.endswith(words)}
    assert {line for _, line, _ in findings(*MAC, str(script))} == marked("# finding on a Mac")
    assert {line for _, line, _ in findings(*TWO_CPU_PROCESSES, str(script))} == \
        marked("# finding on a Mac") | marked("# finding with several processes")
    assert marked("# never read: --gpu defaults to None")
