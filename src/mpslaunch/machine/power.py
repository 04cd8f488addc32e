"""macOS: what keeps a Mac awake, and whether it runs on its battery (`pmset -g batt`).

`caffeinate -i` holds off idle sleep only: a laptop on battery still sleeps when its lid
closes, and the run pauses until it wakes (docs/mps-facts.md: Sleep on a Mac). pmset's first
line names the power source: "Now drawing from 'Battery Power'" or "... 'AC Power'".
"""

from __future__ import annotations

import os
import re
import subprocess

CAFFEINATE = "caffeinate"
PMSET = "pmset"
_TIMEOUT_SECONDS = 2.0
_SOURCE = r"Now drawing from '([^']+)'"  # compiled (and kept by re) when pmset answers


def caffeinate_on_path() -> bool:
    """caffeinate is an executable file in a folder of PATH, where starting it will find it.
    (shutil.which would do, but shutil imports the archive modules at every launch on a Mac.)"""
    for folder in os.get_exec_path():
        path = os.path.join(folder, CAFFEINATE)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return True
    return False


def on_battery() -> bool | None:
    """True on battery power, False on another source; None where pmset gives no answer in
    time (not a Mac, no pmset)."""
    try:
        done = subprocess.run(
            [PMSET, "-g", "batt"],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_SECONDS,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return power_source_is_battery(done.stdout) if done.returncode == 0 else None


def power_source_is_battery(text: str) -> bool | None:
    """pmset -g batt's answer -> True for 'Battery Power', False for any other source, None
    when it names none."""
    found = re.search(_SOURCE, text)
    return None if found is None else found.group(1) == "Battery Power"
