"""The hand checks of the several-process path, on the torch this interpreter has (Linux).

Run by run_releases.py with each release's own Python; prints one JSON object: check -> "ok" or
what went wrong. Each check runs `python -m mpslaunch` as a user would, in a scratch folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

LAUNCH = [sys.executable, "-m", "mpslaunch", "launch", "--cpu", "-q", "--num_processes", "2"]
MARKER = "MPSLAUNCH_COMPAT_MARKER"  # in the launcher's environment: its ranks inherit it

ALL_REDUCE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print("SUM", dist.get_rank(), total.item(), flush=True)
dist.destroy_process_group()
"""

# Each rank says it is ready; rank 1 exits 3 once rank 0 is ready (argv[2] == "fail");
# otherwise both wait for <folder>/go.
WAITS = """
import os, sys, time
from pathlib import Path
folder, rank = Path(sys.argv[1]), os.environ["RANK"]
(folder / f"ready.{rank}").write_text("yes")
if sys.argv[2] == "fail" and rank == "1":
    while not (folder / "ready.0").exists():
        time.sleep(0.05)
    sys.exit(3)
deadline = time.monotonic() + 120
while not (folder / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def main() -> None:
    import torch

    results = {"torch": torch.__version__.split("+")[0]}
    for name, check in CHECKS.items():
        with tempfile.TemporaryDirectory(prefix=f"compat-{name}-") as folder:
            try:
                problem = check(Path(folder))
            except subprocess.TimeoutExpired:
                problem = "timed out"
            results[name] = problem or "ok"
    print(json.dumps(results))


def all_reduce(folder: Path) -> str | None:
    script = folder / "allreduce.py"
    script.write_text(ALL_REDUCE)
    done = finished([*LAUNCH, str(script)], seconds=120)
    sums = sorted(line for line in done.stdout.splitlines() if " SUM " in line)
    if done.returncode != 0 or sums != ["[rank0] SUM 0 3.0", "[rank1] SUM 1 3.0"]:
        return f"exit {done.returncode}, {sums}: {last_line(done.stderr)}"
    return None


def failing_rank(folder: Path) -> str | None:
    done = finished([*LAUNCH, "--log_dir", str(folder / "logs"), str(waiting_script(folder)),
                     str(folder), "fail"], seconds=120)
    summary = last_line(done.stderr)
    if done.returncode != 3 or "rank 1 failed first: it exited with code 3" not in summary \
            or not summary.endswith("; rank 0 was stopped"):
        return f"exit {done.returncode}: {summary}"
    return None


def sigterm(folder: Path) -> str | None:
    launcher, marker = start(folder, [*LAUNCH, str(waiting_script(folder)), str(folder), "wait"])
    if not ready(folder, launcher):
        return f"the ranks never started: {last_line(launcher.communicate()[1])}"
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=60)
    left = marked(marker)
    if launcher.returncode != 143 or left:
        return f"exit {launcher.returncode}, left behind {left}: {last_line(stderr)}"
    return None


def self_test(folder: Path) -> str | None:
    done = finished([sys.executable, "-m", "mpslaunch", "test", "--cpu", "--num_processes", "2"],
                    seconds=300, cwd=folder)
    return None if done.returncode == 0 else f"exit {done.returncode}: {last_line(done.stderr)}"


def ignored_signal(signum: int):
    """nohup (SIGHUP) and a non-interactive shell's `&` (SIGINT) start the launcher with the
    signal ignored: the signal then comes, and the run goes on to end well."""
    def check(folder: Path) -> str | None:
        launcher, marker = start(folder, [*LAUNCH, str(waiting_script(folder)), str(folder), "wait"],
                                 ignore=signum)
        if not ready(folder, launcher):
            return f"the ranks never started: {last_line(launcher.communicate()[1])}"
        launcher.send_signal(signum)
        time.sleep(1.0)
        (folder / "go").write_text("")
        _, stderr = launcher.communicate(timeout=60)
        return None if launcher.returncode == 0 else f"exit {launcher.returncode}: {last_line(stderr)}"
    return check


def finished(command: list[str], seconds: float, cwd: Path | None = None):
    """The command's run; past `seconds` it is stopped with SIGTERM, as a user would, so that
    it cleans up its ranks, and the check fails."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=cwd) as launcher:
        try:
            out, err = launcher.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            launcher.terminate()
            launcher.communicate(timeout=60)
            raise
    return subprocess.CompletedProcess(command, launcher.returncode, out, err)


def waiting_script(folder: Path) -> Path:
    script = folder / "waits.py"
    script.write_text(WAITS)
    return script


def start(folder: Path, command: list[str], ignore: int | None = None):
    marker = uuid.uuid4().hex
    restore = (lambda: signal.signal(ignore, signal.SIG_IGN)) if ignore else None
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, MARKER: marker}, cwd=folder,
                                preexec_fn=restore)
    return launcher, marker


def ready(folder: Path, launcher: subprocess.Popen, seconds: float = 90) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and launcher.poll() is None:
        if all((folder / f"ready.{rank}").exists() for rank in (0, 1)):
            return True
        time.sleep(0.05)
    return False


def marked(marker: str, seconds: float = 5) -> list[int]:
    """The processes still alive that carry the run's marker (after a short wait for stragglers)."""
    deadline = time.monotonic() + seconds
    while True:
        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get(MARKER) == marker and process.status() != "zombie":
                    found.append(process.pid)
            except psutil.Error:
                pass
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:300] if lines else "(nothing on stderr)"


CHECKS = {
    "all-reduce": all_reduce,
    "failing rank": failing_rank,
    "SIGTERM": sigterm,
    "test 2 processes": self_test,
    "nohup (HUP)": ignored_signal(signal.SIGHUP),
    "background (INT)": ignored_signal(signal.SIGINT),
}

if __name__ == "__main__":
    main()
