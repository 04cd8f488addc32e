"""What a script is checked against: the device, the processes, and how DataLoader workers start.

The plan `launch` would make here gives it, or the command line describes one (a Mac checked
from a Linux machine), so nothing here probes the machine.
"""

from __future__ import annotations

import sys

from mpslaunch import Record, record


@record
class Target(Record):
    device: str  # "mps", "cuda" or "cpu"
    processes: int  # on all machines
    system: str  # "Darwin", "Linux", "Windows"
    python: tuple[int, int] = sys.version_info[:2]

    @property
    def start_method(self) -> str:
        """How DataLoader workers start: Python's default start method on that system
        (docs/mps-facts.md: DataLoader workers)."""
        if self.system in ("Darwin", "Windows"):
            return "spawn"
        return "forkserver" if self.python >= (3, 14) else "fork"

    @property
    def where(self) -> str:
        """Why workers start that way, for messages."""
        if self.system == "Darwin":
            return "on macOS"
        if self.system == "Windows":
            return "on Windows"
        return f"with Python {self.python[0]}.{self.python[1]} on Linux"

    def describe(self) -> str:
        processes = f"{self.processes} process" + ("es" if self.processes > 1 else "")
        return f"{self.device}, {processes}, {self.where}"


def described_target(device: str, processes: int, this_system: str) -> Target:
    """A target the command line describes: mps is always a Mac; cuda is Linux unless this is
    Linux or Windows; cpu is this machine's system."""
    if device == "mps":
        system = "Darwin"
    elif device == "cuda":
        system = this_system if this_system in ("Linux", "Windows") else "Linux"
    else:
        system = this_system
    return Target(device, processes, system)
