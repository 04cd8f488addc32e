"""Launch overhead and launcher memory: `mpslaunch launch --cpu s.py` against `python s.py`.

s.py imports torch and exits, like the start of any training script. The commands run in turn
and their medians are compared; the launcher's own peak memory (not its child's) is read while
the child runs. `--with-accelerate` also times `accelerate launch --cpu s.py`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = "import torch\ntorch.ones(1)\n"
SLEEPY_SCRIPT = "import time, torch\ntime.sleep(3)\n"


def mpslaunch_command() -> list[str]:
    found = shutil.which("mpslaunch", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "mpslaunch"]


def time_once(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def launcher_peak_rss_mb(command: list[str]) -> float:
    """Peak resident memory of the launcher process itself, read while its child still runs."""
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    time.sleep(2.0)  # the child is importing torch or sleeping by now
    status = Path(f"/proc/{launcher.pid}/status")
    peak_kb = None
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak_kb = int(line.split()[1])
    else:  # not Linux: psutil's current RSS is the best we have
        import psutil

        peak_kb = psutil.Process(launcher.pid).memory_info().rss // 1024
    launcher.wait()
    return peak_kb / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (default: 7)")
    parser.add_argument("--with-accelerate", action="store_true",
                        help="also time `accelerate launch --cpu s.py`")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mpslaunch-bench-"))
    script, sleepy = folder / "s.py", folder / "sleepy.py"
    script.write_text(SCRIPT)
    sleepy.write_text(SLEEPY_SCRIPT)
    os.environ.setdefault("MPSLAUNCH_CONFIG_DIR", str(folder))  # no user profile interferes
    commands = {
        "python s.py": [sys.executable, str(script)],
        "mpslaunch launch --cpu s.py": [*mpslaunch_command(), "launch", "--cpu", "-q", str(script)],
    }
    if options.with_accelerate:
        accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
        commands["accelerate launch --cpu s.py"] = [accelerate, "launch", "--cpu", str(script)]
    for command in commands.values():
        time_once(command)  # warm the file cache
    times = {name: [] for name in commands}
    for _ in range(options.runs):
        for name, command in commands.items():
            times[name].append(time_once(command))
    base = statistics.median(times["python s.py"])
    print(f"{'command':32} {'median s':>9} {'ratio':>6}   ({options.runs} alternating runs)")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:32} {median:9.3f} {median / base:6.3f}")
    sleepy_command = [*mpslaunch_command(), "launch", "--cpu", "-q", str(sleepy)]
    print(f"launcher peak RSS (mpslaunch process only): {launcher_peak_rss_mb(sleepy_command):.1f} MB")
    if options.with_accelerate:
        accelerate_sleepy = [commands["accelerate launch --cpu s.py"][0], "launch", "--cpu", str(sleepy)]
        print(f"launcher peak RSS (accelerate process only): {launcher_peak_rss_mb(accelerate_sleepy):.1f} MB")
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
