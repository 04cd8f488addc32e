"""The README's plain-PyTorch snippet runs as written under `mpslaunch launch`: one process, and
two CPU processes that build their own gloo group and wrap the model in DDP."""

from __future__ import annotations

import json
import re

import pytest

from helpers import REPO, run_cli, two_gloo_ranks_ended_well, write_script

pytestmark = pytest.mark.slow  # every test here starts processes

# What the snippet leaves to the reader: a model, and the training at `...`.
MODEL = "import torch\nMyModel = lambda: torch.nn.Linear(4, 2)\n"
TRAINING = """\
import json
loss = model(torch.ones(8, 4, device=device)).sum()
loss.backward()
print(json.dumps({"device": str(device), "ddp": type(model).__name__,
                  "world": int(os.environ.get("WORLD_SIZE", "1"))}))
"""


def readme_snippet() -> str:
    section = (REPO / "README.md").read_text().split("## Your script", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.+?)\n```", section, re.S)[0]


def script_from_readme(tmp_path):
    snippet = readme_snippet()
    assert "\n...  " in snippet  # where the training goes
    body = snippet.replace("\n...  ", "\n" + TRAINING + "#  ", 1)
    return write_script(tmp_path, "train.py", MODEL + body)


@pytest.mark.parametrize("processes", [1, 2])
def test_the_plain_pytorch_snippet_trains_on_the_plan(tmp_path, processes):
    script = script_from_readme(tmp_path)
    result = run_cli("launch", "--cpu", "--num_processes", str(processes), str(script),
                     timeout=180)
    assert two_gloo_ranks_ended_well(result), result.stderr
    reports = [json.loads(line.split("] ", 1)[-1]) for line in result.stdout.splitlines()
               if line.rstrip().endswith("}")]
    assert len(reports) == processes
    for report in reports:
        assert report == {"device": "cpu", "world": processes,
                          "ddp": "DistributedDataParallel" if processes > 1 else "Linear"}
