"""Whether a Mac runs on its battery, from a stand-in `pmset` on PATH that answers as macOS's
does (its first line names the power source)."""

from __future__ import annotations

import os
import sys

import pytest

from mpslaunch.machine import power

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for pmset")

ON_BATTERY = ("Now drawing from 'Battery Power'\n"
              " -InternalBattery-0 (id=4653155)\t84%; discharging; 5:12 remaining present: true\n")
ON_AC = ("Now drawing from 'AC Power'\n"
         " -InternalBattery-0 (id=4653155)\t100%; charged; 0:00 remaining present: true\n")
DESKTOP = "Now drawing from 'AC Power'\n"


def standin_pmset(folder, answer: str, code: int = 0, hang: bool = False) -> str:
    """A PATH that starts with a pmset that prints `answer` for `-g batt`."""
    folder.mkdir(exist_ok=True)
    script = folder / "pmset"
    script.write_text("#!/bin/sh\n"
                      + ("exec sleep 30\n" if hang else "")
                      + '[ "$1 $2" = "-g batt" ] || exit 64\n'
                      + f"printf '%s' {answer!r}\nexit {code}\n")
    script.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize("text, expected", [
    (ON_BATTERY, True), (ON_AC, False), (DESKTOP, False),
    ("Now drawing from 'UPS Power'\n", False), ("", None), ("pmset: unknown option\n", None),
])
def test_the_power_source_from_pmsets_answer(text, expected):
    assert power.power_source_is_battery(text) is expected


@pytest.mark.slow
@pytest.mark.parametrize("answer, code, expected", [
    (ON_BATTERY, 0, True), (ON_AC, 0, False), (ON_BATTERY, 1, None)])
def test_on_battery_asks_pmset(tmp_path, monkeypatch, answer, code, expected):
    monkeypatch.setenv("PATH", standin_pmset(tmp_path / "bin", answer, code))
    assert power.on_battery() is expected


@pytest.mark.slow
def test_no_pmset_or_one_that_hangs_gives_no_answer(tmp_path, monkeypatch):
    monkeypatch.setattr(power, "PMSET", str(tmp_path / "no-such-pmset"))
    assert power.on_battery() is None
    monkeypatch.setattr(power, "PMSET", "pmset")
    monkeypatch.setattr(power, "_TIMEOUT_SECONDS", 0.5)
    monkeypatch.setenv("PATH", standin_pmset(tmp_path / "slow", ON_BATTERY, hang=True))
    assert power.on_battery() is None
