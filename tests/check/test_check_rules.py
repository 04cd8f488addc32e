"""`mpslaunch check`'s rules on scripts written the way training scripts are written: each
finding on the plans where it breaks the run, and silence where it does not (the examples, the
README's snippet, an Accelerate script, a careful script with workers, device checks around
cuda calls)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import REPO, write_script
from mpslaunch.check import Target, check_script

SCRIPTS = Path(__file__).parent / "scripts"
MAC = Target("mps", 1, "Darwin")
MAC_CPU = Target("cpu", 1, "Darwin")
MAC_CPU_2 = Target("cpu", 2, "Darwin")
LINUX_CPU = Target("cpu", 1, "Linux", (3, 12))
LINUX_CPU_2 = Target("cpu", 2, "Linux", (3, 12))
LINUX_CPU_PY314 = Target("cpu", 1, "Linux", (3, 14))
LINUX_CUDA = Target("cuda", 1, "Linux", (3, 12))
LINUX_CUDA_2 = Target("cuda", 2, "Linux", (3, 12))
EVERY_PLAN = [MAC, MAC_CPU, MAC_CPU_2, LINUX_CPU, LINUX_CPU_2, LINUX_CPU_PY314, LINUX_CUDA, LINUX_CUDA_2]


def found(path: Path, target: Target) -> set[tuple[str, int, str]]:
    """(file name, line, rule) of each finding."""
    return {(Path(f.file).name, f.line, f.rule) for f in check_script(path, target).findings}


def line_of(path: Path, text: str, nth: int = 1) -> int:
    lines = [number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return lines[nth - 1]


# ---------------------------------------------------------------- a CUDA-first script


CUDA_FIRST = SCRIPTS / "cuda_first.py"
MODELS = SCRIPTS / "models.py"


def test_a_cuda_first_script_planned_for_mps_names_each_problem_with_its_line():
    line = lambda text: line_of(CUDA_FIRST, text)  # noqa: E731
    assert found(CUDA_FIRST, MAC) == {
        ("cuda_first.py", line("set_default_dtype"), "float64-mps"),
        ("cuda_first.py", line("loader = DataLoader"), "workers-pickle"),  # lambda transform, local collate
        ("cuda_first.py", line("loader = DataLoader"), "pin-memory-mps"),
        ("cuda_first.py", line(".cuda()"), "cuda-device"),
        ("cuda_first.py", line("torch.load"), "load-map-location"),
        ("cuda_first.py", line("GradScaler()"), "cuda-amp"),
        ("cuda_first.py", line('.to("cuda"'), "cuda-device"),
        ("cuda_first.py", line("with autocast()"), "cuda-amp"),
        ("cuda_first.py", line('device="cuda"'), "cuda-device"),
        # the local module it imports; its unused helper and its main block are left out
        ("models.py", line_of(MODELS, 'torch.device("cuda")'), "cuda-device"),
        ("models.py", line_of(MODELS, ".double()"), "float64-mps"),
    }


def test_each_finding_says_what_happens_and_what_to_write_instead(monkeypatch):
    monkeypatch.chdir(SCRIPTS)
    report = check_script(Path("cuda_first.py"), MAC)
    texts = [finding.line_text() for finding in report.findings]
    assert (f"cuda_first.py:{line_of(CUDA_FIRST, '.cuda()')}: .cuda() fails on a Mac, where torch "
            'has no CUDA ("Torch not compiled with CUDA enabled"); write .to(device) with '
            'device = torch.device(os.environ["MPSLAUNCH_DEVICE"])') in texts
    assert any(text.startswith("models.py:") for text in texts)
    assert any('map_location="cpu"' in text for text in texts)
    assert any("Cannot convert a MPS Tensor to float64" in text for text in texts)
    assert any("collate_fn is collate, a function defined inside main()" in text for text in texts)
    assert any("the dataset keeps a lambda in transform" in text for text in texts)
    # each mps finding names the docs/mps-facts.md section it rests on, and that section exists
    facts = (REPO / "docs" / "mps-facts.md").read_text()
    for finding in report.findings:
        assert finding.fact and f"## {finding.fact}" in facts
    # what stops the run comes before what only misbehaves
    assert [f.breaks for f in report.findings] == sorted((f.breaks for f in report.findings), reverse=True)


def test_the_cuda_first_script_on_several_cpu_processes():
    rules = {rule for _, _, rule in found(CUDA_FIRST, LINUX_CPU_2)}
    assert rules == {"nccl-cpu", "cuda-device", "load-map-location", "cuda-amp"}
    assert "nccl-cpu" not in {rule for _, _, rule in found(CUDA_FIRST, LINUX_CPU)}  # one process
    nccl = [f for f in check_script(CUDA_FIRST, MAC_CPU_2).findings if f.rule == "nccl-cpu"][0]
    assert "Distributed package doesn't have NCCL built in" in nccl.message  # the macOS wheels
    assert nccl.fact == "Scripts written for CUDA"


def test_the_cuda_first_script_is_fine_on_cuda():
    assert found(CUDA_FIRST, LINUX_CUDA) == set()
    assert found(CUDA_FIRST, LINUX_CUDA_2) == set()


# ---------------------------------------------------------------- DataLoader workers


def test_a_tutorial_that_trains_at_module_level_breaks_where_workers_are_spawned():
    script = SCRIPTS / "tutorial_unguarded.py"
    expected = {("tutorial_unguarded.py", line_of(script, "DataLoader("), "workers-main-guard")}
    assert found(script, MAC) == expected
    assert found(script, MAC_CPU) == expected  # spawn is macOS's, whatever the device
    assert found(script, LINUX_CPU_PY314) == expected  # forkserver, Python 3.14's default on Linux
    assert found(script, LINUX_CPU) == set()  # fork: the workers do not run the script again
    message = check_script(script, LINUX_CPU_PY314).findings[0].message
    assert "start by forkserver with Python 3.14 on Linux" in message and "bootstrapping phase" in message


def test_a_main_called_without_the_guard_and_a_lambda_collate_fn():
    script = SCRIPTS / "main_unguarded.py"
    line = line_of(script, "loader = DataLoader")
    assert found(script, MAC) == {("main_unguarded.py", line, "workers-main-guard"),
                                  ("main_unguarded.py", line, "workers-pickle")}
    assert found(script, LINUX_CPU) == set()


def test_start_method_fork_chosen_by_the_script_silences_the_worker_rules(tmp_path):
    body = (SCRIPTS / "main_unguarded.py").read_text().replace(
        "NUM_WORKERS = 4", 'NUM_WORKERS = 4\ntorch.multiprocessing.set_start_method("fork")')
    assert found(write_script(tmp_path, "forked.py", body), MAC_CPU) == set()


def test_no_workers_no_worker_findings(tmp_path):
    body = (SCRIPTS / "main_unguarded.py").read_text().replace("NUM_WORKERS = 4", "NUM_WORKERS = 0")
    assert found(write_script(tmp_path, "inline.py", body), MAC) == set()


# ---------------------------------------------------------------- a one-file GPT trainer


def test_module_constants_reach_the_rules_and_a_config_run_by_exec_leaves_the_default(tmp_path):
    script = SCRIPTS / "gpt_trainer.py"
    to_device = {("gpt_trainer.py", line_of(script, "return x.to(device)"), "cuda-device"),
                 ("gpt_trainer.py", line_of(script, "model.to(device)"), "cuda-device")}
    # dtype is "float16" wherever CUDA is missing, so GradScaler(enabled=dtype == "float16") is on
    scaler = {("gpt_trainer.py", line_of(script, "GradScaler("), "cuda-amp")}
    assert found(script, MAC) == to_device | scaler
    assert found(script, LINUX_CPU_2) == to_device | scaler | {
        ("gpt_trainer.py", line_of(script, "init_process_group(backend"), "nccl-cpu")}
    message = check_script(script, MAC).findings[0].message
    assert f'device (= "cuda", line {line_of(script, "device = ")})' in message
    # a configurator exec()'d into the module can rebind any setting: the default is reported
    # once, where it is written, and says so
    body = script.read_text().replace('dtype = "bfloat16"', 'exec(open("configurator.py").read())\ndtype = "bfloat16"')
    configurable = write_script(tmp_path, "configurable.py", body)
    default = ("configurable.py", line_of(configurable, 'device = "cuda"'), "cuda-default")
    assert found(configurable, MAC) == {default, ("configurable.py", line_of(configurable, "GradScaler("), "cuda-amp")}
    finding = next(f for f in check_script(configurable, MAC).findings if f.rule == "cuda-default")
    assert "only a config file run by exec() may change" in finding.message
    assert 'set device to "mps"' in finding.fix
    assert found(configurable, LINUX_CUDA) == set()


# ---------------------------------------------------------------- devices a script chooses itself


NOT_A_MAC = [MAC_CPU, LINUX_CPU, LINUX_CUDA]


@pytest.mark.parametrize("name, chosen_at", [
    ("fallback_tutorial.py", 'torch.device("cuda" if torch.cuda.is_available() else "cpu")'),
    ("fallback_flag.py", 'torch.device("cuda" if use_cuda else "cpu")'),
    ("fallback_gan.py", "cuda = torch.cuda.is_available()"),
])
def test_a_device_chosen_between_cuda_and_the_cpu_is_named_once_on_a_mac(name, chosen_at):
    script = SCRIPTS / name
    assert found(script, MAC) == {(name, line_of(script, chosen_at), "cpu-fallback")}
    (finding,) = check_script(script, MAC).findings
    assert "on a Mac: the script trains on the CPU" in finding.message and not finding.breaks
    assert 'torch.device(os.environ.get("MPSLAUNCH_DEVICE", "cpu"))' in finding.fix
    assert "elif torch.backends.mps.is_available()" in finding.fix
    for target in NOT_A_MAC:  # the CPU is the plan there, or CUDA is chosen
        assert found(script, target) == set(), target


def test_tensors_on_a_fallen_back_device_are_cpu_tensors_no_float64_finding():
    script = SCRIPTS / "fallback_tutorial.py"
    assert "float64-mps" not in {rule for _, _, rule in found(script, MAC)}
    # the same line with the device written out as mps is a finding
    assert found_in(script.read_text().replace('"cuda" if torch.cuda.is_available() else "cpu"', '"mps"'),
                    MAC) == {("float64-mps", line_of(script, "dtype=torch.float64"))}


def test_options_of_a_flag_fallback_are_read_in_the_branch_the_mac_takes():
    # pin_memory and workers are set only under `if use_cuda:`, false on a Mac
    rules = {rule for _, _, rule in found(SCRIPTS / "fallback_flag.py", MAC)}
    assert rules == {"cpu-fallback"}


def test_a_script_that_already_offers_mps_is_not_a_fallback(tmp_path):
    body = (SCRIPTS / "fallback_tutorial.py").read_text().replace(
        'torch.device("cuda" if torch.cuda.is_available() else "cpu")',
        'torch.device("cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu")')
    script = write_script(tmp_path, "offers_mps.py", body)
    # no fall-back; and the float64 tensor is now on mps, where it fails
    assert found(script, MAC) == {("offers_mps.py", line_of(script, "dtype=torch.float64"), "float64-mps")}


def test_guards_are_read_by_what_they_test_not_by_their_words():
    script = SCRIPTS / "accelerate_guards.py"
    expected = {("accelerate_guards.py", line_of(script, "state = torch.load(args.resume)"), "load-map-location"),
                ("accelerate_guards.py", line_of(script, 'shadow.to(device="cuda")'), "cuda-device"),
                ("accelerate_guards.py", line_of(script, 'torch.autocast("cuda")'), "cuda-amp")}
    # main process, gradient sync, `args.gpu is None` (true by default): none keeps cuda away
    assert found(script, MAC) == expected
    assert found(script, LINUX_CPU) == expected
    assert found(script, LINUX_CUDA) == set()


def test_an_assert_or_an_exit_without_cuda_guards_what_follows():
    script = SCRIPTS / "gpu_required.py"
    # only the load before the assert; after it, and after `if not ...: sys.exit()`, nothing runs
    assert found(script, MAC) == {("gpu_required.py", line_of(script, "torch.load(checkpoint)"), "load-map-location")}


def test_an_option_defaulting_to_cuda_is_named_with_what_to_pass():
    script = SCRIPTS / "device_option.py"
    option = line_of(script, '"--device", default="cuda"')
    flag = line_of(script, '"cuda" if args.gpu else "cpu"')
    assert found(script, MAC) == {("device_option.py", option, "cuda-default"),
                                  ("device_option.py", flag, "cuda-device")}
    default = [f for f in check_script(script, MAC).findings if f.rule == "cuda-default"][0]
    assert default.message.startswith('--device defaults to "cuda"') and default.fix == "pass --device mps"
    on_cpu = [f for f in check_script(script, LINUX_CPU).findings if f.rule == "cuda-default"][0]
    assert on_cpu.fix == "pass --device cpu"
    assert found(script, LINUX_CUDA) == set()


def test_checkpoints_the_script_writes_itself_load_where_they_were_saved():
    script = SCRIPTS / "checkpoints.py"
    expected = {("checkpoints.py", line_of(script, "torch.load(args.init))"), "load-map-location"),
                ("checkpoints.py", line_of(script, 'map_location=f"cuda:{rank}"'), "load-map-location"),
                ("checkpoints.py", line_of(script, "map_location=first_gpu"), "load-map-location")}
    assert found(script, MAC) == expected
    assert found(script, LINUX_CPU) == expected
    assert found(script, LINUX_CUDA) == set()
    texts = " ".join(f.message for f in check_script(script, MAC).findings)
    assert 'map_location=first_gpu (= "cuda:0", line' in texts and 'map_location=f"cuda:..."' in texts


def test_pin_memory_in_a_kwargs_dict_and_a_scaler_switched_on_by_the_plan():
    script = SCRIPTS / "loader_kwargs.py"
    assert found(script, MAC) == {("loader_kwargs.py", line_of(script, "DataLoader(data"), "pin-memory-mps"),
                                  ("loader_kwargs.py", line_of(script, "GradScaler(enabled=half)"), "cuda-amp")}
    assert found(script, LINUX_CPU) == {("loader_kwargs.py", line_of(script, "GradScaler(enabled=half)"), "cuda-amp")}
    assert found(script, LINUX_CUDA) == set()


STAR_AND_DEFAULTS = """\
import argparse
from helpers import *  # brings torch along

parser = argparse.ArgumentParser()
parser.add_argument("--pin", action="store_true")
parser.add_argument("--no-pin", dest="pin", action="store_false")
parser.set_defaults(pin=True)
args = parser.parse_args()
weights = torch.load("pretrained.pt")
loader = torch.utils.data.DataLoader(list(range(8)), pin_memory=args.pin)
"""


def test_torch_through_a_star_import_and_an_option_set_by_set_defaults():
    assert found_in(STAR_AND_DEFAULTS, MAC) == {("load-map-location", 9), ("pin-memory-mps", 10)}
    assert found_in(STAR_AND_DEFAULTS.replace("set_defaults(pin=True)", "set_defaults(pin=False)"), MAC) == {
        ("load-map-location", 9)}


def test_in_a_notebook_an_unpicklable_function_belongs_in_a_module(tmp_path):
    import json

    cells = ["import torch\nfrom torch.utils.data import DataLoader",
             "loader = DataLoader(list(range(8)), num_workers=2, collate_fn=lambda batch: batch)"]
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                "cells": [{"cell_type": "code", "metadata": {}, "source": cell, "outputs": [],
                           "execution_count": None} for cell in cells]}
    script = write_script(tmp_path, "train.ipynb", json.dumps(notebook))
    (finding,) = check_script(script, MAC).findings
    assert finding.rule == "workers-pickle"
    assert finding.fix == "define collate_fn in a .py module beside the notebook, and import it"


def found_in(text: str, target: Target) -> set[tuple[str, int]]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        script = write_script(Path(folder), "script.py", text)
        return {(f.rule, f.line) for f in check_script(script, target).findings}


# ---------------------------------------------------------------- silence where nothing breaks


@pytest.mark.parametrize("target", EVERY_PLAN, ids=lambda t: f"{t.device}{t.processes}-{t.system}-{t.python[1]}")
@pytest.mark.parametrize("script", [REPO / "examples" / "cv_example.py",
                                    REPO / "examples" / "complete_cv_example.py",
                                    SCRIPTS / "guarded_workers.py",
                                    SCRIPTS / "accelerate_script.py"], ids=lambda p: p.name)
def test_careful_scripts_stay_silent_on_every_plan(script, target):
    assert check_script(script, target).findings == ()


def test_the_readme_snippet_stays_silent(tmp_path):
    section = (REPO / "README.md").read_text().split("## Your script", 1)[1].split("\n## ", 1)[0]
    snippet = re.findall(r"```python\n(.+?)\n```", section, re.S)[0]
    assert "init_process_group" in snippet
    script = write_script(tmp_path, "snippet.py", snippet)
    for target in EVERY_PLAN:
        assert check_script(script, target).findings == ()


GUARDED = '''\
import torch, torch.distributed as dist
from torch.utils.data import DataLoader

use_cuda = torch.cuda.is_available()
model = torch.nn.Linear(2, 2)
if torch.cuda.is_available():
    model = model.cuda()
    dist.init_process_group("nccl")
elif torch.backends.mps.is_available():
    model = model.to("mps")
else:
    model = model.to("cpu")
x = torch.ones(2).cuda() if use_cuda else torch.ones(2)
y = use_cuda and torch.ones(2).cuda()
try:
    state = torch.load("last.pt")
except RuntimeError:
    state = None
try:
    model.cuda()
except (AssertionError, RuntimeError):
    pass
scaler = torch.cuda.amp.GradScaler(enabled=use_cuda)
with torch.autocast(device_type="cuda" if use_cuda else "cpu"):
    pass
metric = torch.zeros(3, dtype=torch.float64)
z = model(torch.ones(2)).detach().cpu().double()
loader = DataLoader(list(range(8)), num_workers=0, collate_fn=lambda batch: batch)
backend = "nccl" if use_cuda else "gloo"
dist.init_process_group(backend)
config = dict(device="cuda", lr=0.1)  # settings to log, not a tensor's device
config.update(device="cuda")


def never_called():
    return torch.ones(1).cuda()
'''


def test_code_that_already_chooses_by_device_stays_silent(tmp_path):
    script = write_script(tmp_path, "guarded.py", GUARDED)
    for target in EVERY_PLAN:
        assert found(script, target) == set(), target


# ---------------------------------------------------------------- what the check reads


def test_a_local_module_with_a_syntax_error_is_skipped_and_said(tmp_path):
    write_script(tmp_path, "helpers.py", "def broken(:\n")
    script = write_script(tmp_path, "train.py", "import helpers\nimport torch\ntorch.ones(1).cuda()\n")
    report = check_script(script, MAC)
    assert [f.rule for f in report.findings] == ["cuda-device"]
    assert len(report.skipped) == 1 and "helpers.py:1: syntax error" in report.skipped[0]


def test_packages_and_relative_imports_in_the_scripts_folder_are_read(tmp_path):
    (tmp_path / "lib").mkdir()
    write_script(tmp_path / "lib", "__init__.py", "from .nets import Net\n")
    write_script(tmp_path / "lib", "nets.py", "import torch\n\n\nclass Net(torch.nn.Module):\n"
                 "    def forward(self, x):\n        return x.cuda()\n")
    script = write_script(tmp_path, "train.py", "from lib import Net\nNet()\n")
    report = check_script(script, MAC)
    assert [Path(name).name for name in report.files] == ["train.py", "__init__.py", "nets.py"]
    assert [(Path(f.file).name, f.line) for f in report.findings] == [("nets.py", 6)]


# ---------------------------------------------------------------- launch reads only what can matter


def generated_benchmark_script(tmp_path) -> Path:
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_speed", REPO / "benchmarks" / "check_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return write_script(tmp_path, "generated.py", module.generated_script())


SPLIT_INSIDE_A_STRING = '''\
import torch


def helper():
    """Make a tensor.
Example: helper()
    """
    return torch.ones(1).cuda()


def unrelated():
    return 1


if __name__ == "__main__":
    helper()
    unrelated()
'''


def test_reading_only_the_parts_a_rule_can_be_about_finds_the_same(tmp_path):
    generated = generated_benchmark_script(tmp_path)
    split = write_script(tmp_path, "split.py", SPLIT_INSIDE_A_STRING)
    scripts = [*SCRIPTS.glob("*.py"), REPO / "examples" / "cv_example.py",
               REPO / "examples" / "complete_cv_example.py", generated, split,
               write_script(tmp_path, "guarded.py", GUARDED)]
    for script in scripts:
        for target in EVERY_PLAN:
            assert check_script(script, target, whole=False) == check_script(script, target), (script, target)
    assert found(tmp_path / "split.py", MAC) == {("split.py", 8, "cuda-device")}
    from mpslaunch.check.reading import read_sources

    assert len(read_sources(generated, whole=False).files[0].left_out) > 100
    assert read_sources(split, whole=False).files[0].left_out == ()  # split in a string: read whole
