"""The silent CPU fall-back through the CLI: `mpslaunch check --device mps` names it, and
`mpslaunch launch` on a Mac shows it before any other finding, since it decides how fast the
whole run is. The Mac is described (os.uname, sysctl's answers, and a kept answer that torch can
use mps), as in tests/commands/test_described_mac.py; the check itself is real."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import DESCRIBED_MAC_BUILD as BUILD
from helpers import ON_A_MAC_CLI as ON_A_MAC
from helpers import run_cli, write_script
from mpslaunch.machine import probe, torch_check

pytestmark = pytest.mark.slow  # every test here starts processes

SCRIPTS = Path(__file__).parent / "scripts"


def test_check_for_a_mac_names_the_fallback_and_what_to_write():
    result = run_cli("check", "--device", "mps", "fallback_tutorial.py", cwd=SCRIPTS)
    assert result.returncode == 1, result.stderr
    first, last = result.stdout.splitlines()
    assert first.startswith("fallback_tutorial.py:5: `'cuda' if torch.cuda.is_available() else 'cpu'` "
                            "leaves the work on the CPU on a Mac")
    assert 'torch.device(os.environ.get("MPSLAUNCH_DEVICE", "cpu"))' in first
    assert last == "1 finding for mps, 1 process, on macOS"
    report = json.loads(run_cli("check", "--device", "mps", "--json", "fallback_gan.py", cwd=SCRIPTS).stdout)
    assert [(f["rule"], f["line"], f["breaks"]) for f in report["findings"]] == [("cpu-fallback", 6, False)]
    assert run_cli("check", "--device", "cpu", "fallback_tutorial.py", cwd=SCRIPTS).returncode == 0


def test_launch_on_a_mac_shows_the_fallback_before_what_stops_the_run(tmp_path, isolated_cache_dir):
    key = torch_check.cache_key(sys.executable, probe().torch_version, BUILD)
    works = torch_check.MpsAnswer(True, "works", "", "2026-01-01 10:00")
    (isolated_cache_dir / torch_check.CACHE_FILE).write_bytes(marshal.dumps({key: works._asdict()}))
    body = (SCRIPTS / "fallback_tutorial.py").read_text() + "\ntorch.load('weights.pt')\nnet.cuda()\n"
    script = write_script(tmp_path, "train.py", body)
    result = subprocess.run([sys.executable, "-c", ON_A_MAC, "launch", "--dry-run", str(script)],
                            capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert result.returncode == 0, result.stderr
    assert "device:          mps" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if line.startswith("mpslaunch: warning: ")]
    assert len(warnings) == 3
    assert "leaves the work on the CPU on a Mac" in warnings[0]  # first, though the others stop the run
    assert "torch.load without map_location" in warnings[1] and ".cuda() fails on a Mac" in warnings[2]
    # `check` lists it first too
    listed = run_cli("check", "--device", "mps", str(script)).stdout.splitlines()
    assert "leaves the work on the CPU" in listed[0] and ".cuda() fails" in listed[2]
