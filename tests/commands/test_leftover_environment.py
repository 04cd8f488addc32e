"""Variables another launcher left in the shell (a torchrun or SLURM job's RANK, WORLD_SIZE,
MASTER_ADDR, ...): a plan for one process removes them from the script's environment and names
them, in the plan line and in --dry-run. Left in, they tell Accelerator() (and
init_process_group) that the script is rank 2 of 3, and it waits for the others forever.
Removing rather than refusing: the plan is mpslaunch's, it is one process, and the variables
describe a world of another launcher that this run is not part of; a refusal would only make
the user unset them in every such shell. Several processes get torch's own values.
"""

from __future__ import annotations

import pytest

from helpers import MACHINES, run_cli, write_script
from mpslaunch.settings import LaunchRequest
from mpslaunch.plan import resolve
from mpslaunch.settings import Profile

LEFT_BY_TORCHRUN = {"WORLD_SIZE": "3", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}

ACCELERATE_PROBE = """
import os
from accelerate import Accelerator
accelerator = Accelerator()
print("processes", accelerator.num_processes, "rank", accelerator.process_index,
      "left", sorted(key for key in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT") if key in os.environ))
"""

NAMED = ("removed from the script's environment (another launcher's; this plan is one process): "
         "MASTER_ADDR=127.0.0.1, MASTER_PORT=29999, RANK=2, WORLD_SIZE=3")


@pytest.mark.slow
def test_an_accelerate_script_runs_as_the_one_process_planned(tmp_path):
    script = write_script(tmp_path, "acc_probe.py", ACCELERATE_PROBE)
    result = run_cli("launch", "--cpu", str(script), env=LEFT_BY_TORCHRUN, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "processes 1 rank 0 left []"
    assert result.stderr.strip().splitlines()[0].endswith("; " + NAMED)


@pytest.mark.slow
def test_dry_run_names_what_is_removed(tmp_path):
    script = write_script(tmp_path, "acc_probe.py", ACCELERATE_PROBE)
    result = run_cli("launch", "--cpu", "--dry-run", str(script),
                     env={**LEFT_BY_TORCHRUN, "TORCHELASTIC_RUN_ID": "old"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("environment removed (another launcher's; this plan is one process):")
    assert lines[start + 1:start + 6] == ["  MASTER_ADDR=127.0.0.1", "  MASTER_PORT=29999", "  RANK=2",
                                          "  TORCHELASTIC_RUN_ID=old", "  WORLD_SIZE=3"]


@pytest.mark.parametrize("processes, removed", [(1, LEFT_BY_TORCHRUN), (2, {})])
def test_only_a_one_process_plan_removes_them(processes, removed):
    environ = {**LEFT_BY_TORCHRUN, "PMI_SIZE": "4", "HOME": "/home/me"}
    plan = resolve(Profile(), LaunchRequest("train.py", cpu=True, num_processes=processes),
                   MACHINES["linux_cpu"], environ)
    assert dict(plan.removed) == ({**removed, "PMI_SIZE": "4"} if removed else {})
