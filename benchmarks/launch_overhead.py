"""Launch overhead and launcher memory: `mpslaunch launch --cpu -q s.py` against `python s.py`.

s.py imports torch and exits, like the start of any training script; pass.py does nothing, so
`mpslaunch launch --cpu -q pass.py` against `python pass.py` is the launcher's own fixed cost,
and without -q (the script read first, the run watched) the default launch's. The
commands run in turn and their medians are compared, with each command's peak memory (the
launcher's, whose child is smaller); the launcher's own peak memory beside a torch child is read
while that child runs. `--with-accelerate` also times `accelerate launch --cpu s.py`.
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
NOTHING = "pass\n"
SLEEPY_SCRIPT = "import time, torch\ntime.sleep(3)\n"


def mpslaunch_command() -> list[str]:
    found = shutil.which("mpslaunch", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "mpslaunch"]


# Runs one command and prints its seconds and peak memory. It is a small process (no site, few
# imports) because a forked child counts its parent's memory at exec as its own peak: forked
# from this benchmark, `python pass.py` would seem to need the benchmark's memory.
RUNNER = """
import os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
elapsed = time.perf_counter() - start
print(elapsed, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def run_once(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Seconds from start to exit, and the peak resident memory in MB of the command's process
    (or of a child it waited for, when that one was bigger). `env`: variables to add."""
    done = subprocess.run([sys.executable, "-S", "-c", RUNNER, *command], capture_output=True,
                          text=True, check=True, env={**os.environ, **(env or {})})
    elapsed, peak, code = done.stdout.split()
    if int(code) != 0:
        raise SystemExit(f"{command} failed with exit code {code}")
    per_mb = 1024 * 1024 if sys.platform == "darwin" else 1024  # bytes on macOS, KB on Linux
    return float(elapsed), int(peak) / per_mb


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
    parser.add_argument("--also-src", metavar="DIR",
                        help="also time the launches of pass.py with the mpslaunch in DIR (another "
                        "checkout's src/), side by side")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mpslaunch-bench-"))
    script, sleepy, nothing = folder / "s.py", folder / "sleepy.py", folder / "pass.py"
    script.write_text(SCRIPT)
    sleepy.write_text(SLEEPY_SCRIPT)
    nothing.write_text(NOTHING)
    os.environ.setdefault("MPSLAUNCH_CONFIG_DIR", str(folder))  # no user profile interferes
    # With --also-src both launchers run as `python -m mpslaunch`, each finding its own sources.
    launcher = [sys.executable, "-m", "mpslaunch"] if options.also_src else mpslaunch_command()
    commands = {
        "python pass.py": [sys.executable, str(nothing)],
        "mpslaunch launch --cpu -q pass.py": [*launcher, "launch", "--cpu", "-q", str(nothing)],
        "python s.py": [sys.executable, str(script)],
        "mpslaunch launch --cpu -q s.py": [*launcher, "launch", "--cpu", "-q", str(script)],
    }
    if options.with_accelerate:
        accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
        commands["accelerate launch --cpu s.py"] = [accelerate, "launch", "--cpu", str(script)]
    # Without -q the launch reads the script first and watches the run (memory, the end line).
    commands["mpslaunch launch --cpu pass.py"] = [*launcher, "launch", "--cpu", str(nothing)]
    envs = {}
    if options.also_src:
        for name in ("mpslaunch launch --cpu -q pass.py", "mpslaunch launch --cpu pass.py"):
            commands[f"{name} (--also-src)"] = commands[name]
            envs[f"{name} (--also-src)"] = {"PYTHONPATH": str(Path(options.also_src).resolve())}
    for name, command in commands.items():
        run_once(command, envs.get(name))  # warm the file cache
    runs = {name: [] for name in commands}
    for _ in range(options.runs):
        for name, command in commands.items():
            runs[name].append(run_once(command, envs.get(name)))
    width = max(map(len, runs))
    print(f"{'command':{width}} {'median s':>9} {'ratio':>6} {'peak MB':>8}   ({options.runs} alternating runs)")
    for name, samples in runs.items():
        base = "python pass.py" if "pass.py" in name else "python s.py"
        median = statistics.median(seconds for seconds, _ in samples)
        base_median = statistics.median(seconds for seconds, _ in runs[base])
        peak = statistics.median(megabytes for _, megabytes in samples)
        print(f"{name:{width}} {median:9.3f} {median / base_median:6.3f} {peak:8.1f}")
    bare = statistics.median(s for s, _ in runs["python pass.py"])
    for name in [name for name in runs if "pass.py" in name and name != "python pass.py"]:
        fixed = statistics.median(s for s, _ in runs[name]) - bare
        print(f"the launcher's fixed cost, {name} - python pass.py: {fixed * 1000:.0f} ms")
    sleepy_command = [*launcher, "launch", "--cpu", "-q", str(sleepy)]
    print(f"launcher peak RSS (mpslaunch process only): {launcher_peak_rss_mb(sleepy_command):.1f} MB")
    if options.with_accelerate:
        accelerate_sleepy = [commands["accelerate launch --cpu s.py"][0], "launch", "--cpu", str(sleepy)]
        print(f"launcher peak RSS (accelerate process only): {launcher_peak_rss_mb(accelerate_sleepy):.1f} MB")
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
