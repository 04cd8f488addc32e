"""macOS: what keeps a Mac awake, and whether it runs on its battery (`pmset -g batt`).

`caffeinate -i` holds off idle sleep only: a laptop on battery still sleeps when its lid
closes, and the run pauses until it wakes (docs/mps-facts.md: Sleep on a Mac). pmset's first
line names the power source: "Now drawing from 'Battery Power'" or "... 'AC Power'".
"""

from __future__ import annotations

import re
import subprocess

CAFFEINATE = "caffeinate"
PMSET = "pmset"
_TIMEOUT_SECONDS = 2.0
_SOURCE = re.compile(r"Now drawing from '([^']+)'")


def on_battery() -> bool | None:
    """True on battery power, False on another source; None where pmset gives no answer in
    time (not a Mac, no pmset)."""
    try:
        done = subprocess.run([PMSET, "-g", "batt"], capture_output=True, text=True,
                              timeout=_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return power_source_is_battery(done.stdout) if done.returncode == 0 else None


def power_source_is_battery(text: str) -> bool | None:
    """pmset -g batt's answer -> True for 'Battery Power', False for any other source, None
    when it names none."""
    found = _SOURCE.search(text)
    return None if found is None else found.group(1) == "Battery Power"
