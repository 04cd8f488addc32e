"""torch's own answer about this machine, asked in a child Python, and the cached mps verdict.

The launcher never imports torch (seconds, hundreds of MB); a separate Python does: is MPS built,
available, and does a small matmul on mps come back right (docs/mps-facts.md: Detecting MPS).
The verdict holds for one Python, one torch and one macOS build, so on a Mac it is cached per
(executable, torch version, macOS build) in the user's cache folder; a damaged cache is ignored
and rewritten. The cache is marshal data, as check/cache.py's entries are: read at every launch
on a Mac, it costs no import (json's compiles regular expressions). `mpslaunch env` always asks
again. Only torch's own answer is kept: a check that could not import torch, or that failed by
itself, says so for this launch and is asked again.

The child runs isolated from the user's folder: a `random.py`, `json.py` or `torch.py` there
would otherwise be imported by the check (and torch's verdict would be about that file).
"""

from __future__ import annotations

import marshal
import os
import subprocess
import time

from mpslaunch import Record, record, user_folder

CHECK_TIMEOUT_SECONDS = 20.0
CACHE_FILE = "mps-check.marshal"
_CACHE_ENTRIES = 20  # one per torch or macOS update; old ones go first
_MARK = "MPSLAUNCH-TORCH-CHECK "

# Runs in the child Python. Prints one marked JSON line; torch's own warnings go elsewhere.
TORCH_CHECK = r"""
import json, sys
facts = {}
def said(error):
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]
try:
    import torch
except Exception as error:
    facts["torch_error"] = said(error)
    print("MPSLAUNCH-TORCH-CHECK " + json.dumps(facts), flush=True)
    sys.exit(0)
facts["torch"] = torch.__version__
facts["torch_cuda"] = torch.version.cuda
mps = getattr(torch.backends, "mps", None)
facts["mps_built"] = bool(mps is not None and mps.is_built())
facts["mps_available"] = bool(facts["mps_built"] and mps.is_available())
if facts["mps_built"] and not facts["mps_available"]:
    try:  # torch's own reason is in the error of a first tensor
        torch.zeros(1, device="mps")
    except Exception as error:
        facts["mps_reason"] = said(error)
if facts["mps_available"]:
    try:
        a = torch.full((64, 64), 1.0, device="mps")
        total = (a @ a).sum()
        torch.mps.synchronize()
        value = total.item()
        expected = 64.0 ** 3
        facts["mps_check"] = ("works" if value == expected
                              else f"fails: 64x64 matmul gave {value}, expected {expected}")
    except Exception as error:
        facts["mps_check"] = "fails: " + said(error)
devices = []
try:
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(index)
            devices.append({"name": p.name, "capability": f"{p.major}.{p.minor}",
                            "memory_gib": round(p.total_memory / 2 ** 30, 1)})
except Exception as error:
    facts["cuda_error"] = said(error)
facts["cuda_devices"] = devices
print("MPSLAUNCH-TORCH-CHECK " + json.dumps(facts), flush=True)
"""


def run_torch_check(python: str, timeout: float, code: str = TORCH_CHECK) -> dict:
    """Run the torch check in a child Python; its facts, or {"check_error": why it gave none}."""
    import json
    import tempfile

    try:
        with tempfile.TemporaryDirectory(prefix="mpslaunch-check-") as empty:
            done = subprocess.run(
                [python, "-c", code],
                capture_output=True,
                text=True,
                cwd=empty,
                env=check_environment(os.environ),
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
    except subprocess.TimeoutExpired:
        return {"timed_out": True}
    except OSError as error:
        return {"check_error": f"cannot start {python} in a folder of its own: {error.strerror}"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK) :])
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"check_error": f"the check process exited with code {done.returncode}: {last[:300]}"}


def check_environment(environ) -> dict[str, str]:
    """The user's environment for the check's child, less what would make it about something
    other than torch. It runs in an empty folder of its own, so `python -c`'s first path entry
    (the folder it runs in) and relative PYTHONPATH entries find nothing of the user's, and with
    PYTHONSAFEPATH (Python 3.11 and later) that entry is not added at all; absolute PYTHONPATH
    entries stay, as the script sees them. PYTHONWARNINGS goes (`error` would turn torch's own
    warnings into a failed import), and PYTHONINSPECT (the check ends when its code does)."""
    kept = {
        name: value
        for name, value in environ.items()
        if name not in ("PYTHONWARNINGS", "PYTHONINSPECT")
    }
    return {**kept, "PYTHONSAFEPATH": "1"}


def is_torchs_own(facts: dict) -> bool:
    """Facts that hold torch's own answer about mps: torch was imported and asked. A check that
    could not import torch (a broken install, or an install under way) or that ended by itself
    gives an answer for this launch only."""
    return "torch" in facts and "check_error" not in facts


# ---------------------------------------------------------------- the verdict


@record
class MpsAnswer(Record):
    """Whether torch can train on mps here, in torch's words, and what to do if not."""

    usable: bool
    detail: str  # "works", or why not (torch's own message where it gave one)
    fix: str  # what to do when not usable; "" when usable
    checked_at: str  # local time of the check, "2026-03-19 14:02"

    def describe(self) -> str:
        verdict = "works" if self.usable else f"not usable: {self.detail}"
        return f"{verdict} (checked {self.checked_at})"


_UPDATE_TORCH = "update torch (pip install -U torch), then run `mpslaunch env` to check again"


def mps_answer(facts: dict, checked_at: str | None = None) -> MpsAnswer | None:
    """The verdict in a torch check's facts; None when the check gave none (it timed out)."""
    if facts.get("timed_out"):
        return None
    detail, fix = _why_not(facts)
    return MpsAnswer(
        usable=detail is None,
        detail=detail or "works",
        fix=fix,
        checked_at=checked_at or time.strftime("%Y-%m-%d %H:%M"),
    )


def _why_not(facts: dict) -> tuple[str | None, str]:
    if "check_error" in facts:
        return (
            f"the check failed: {facts['check_error']}",
            "nothing was kept, the next launch asks again; if it fails again, run "
            "`mpslaunch env` and report its output",
        )
    if "torch_error" in facts:
        return (
            f"torch cannot be imported ({facts['torch_error']})",
            "reinstall torch for this Python (pip install --force-reinstall torch); nothing "
            "was kept, the next launch asks again",
        )
    if not facts.get("mps_built"):
        return (
            "this torch build has no mps",
            "install the macOS arm64 torch from PyPI (pip install --force-reinstall torch)",
        )
    if not facts.get("mps_available"):
        said = facts.get("mps_reason", "no reason given")
        return f"torch.backends.mps.is_available() is False ({said})", _UPDATE_TORCH
    check = facts.get("mps_check", "fails: no result")
    if check != "works":
        return (
            f"a 64x64 matmul on mps {check}",
            f"{_UPDATE_TORCH}; in a virtual machine or a sandbox mps cannot work",
        )
    return None, ""


# ---------------------------------------------------------------- the cache


def cache_key(python: str, torch_version: str, os_build: str) -> str:
    return f"{python} | torch {torch_version} | build {os_build}"


def read_cached(key: str) -> MpsAnswer | None:
    """The cached verdict for this key; None when there is none or the file is damaged."""
    found = _read_entries().get(key)
    try:
        return MpsAnswer(**found) if isinstance(found, dict) else None
    except TypeError:
        return None  # an entry of another shape: checked again, then rewritten


def save(key: str, answer: MpsAnswer) -> None:
    """Add the verdict to the cache; a cache that cannot be written only costs a check later."""
    entries = {name: value for name, value in _read_entries().items() if name != key}
    entries[key] = answer._asdict()
    kept = dict(list(entries.items())[-_CACHE_ENTRIES:])
    from pathlib import Path

    folder = Path(user_folder("cache"))
    partial = folder / f".{CACHE_FILE}.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(marshal.dumps(kept))
        os.replace(partial, folder / CACHE_FILE)  # readers see the old file or the new one
    except OSError:
        try:
            partial.unlink(missing_ok=True)
        except OSError:
            pass


def _read_entries() -> dict:
    try:
        with open(os.path.join(user_folder("cache"), CACHE_FILE), "rb") as file:
            entries = marshal.loads(file.read())
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    return entries if isinstance(entries, dict) else {}
