"""The memory watch costs nothing measurable: a CPU-bound script under `mpslaunch launch` with the
watch (the default) and without it (-q), in turn, in one run.

The script times its own work (a fixed pure-Python loop on one core) and prints the seconds, so
launch and import times do not dilute the comparison. Then, in this process, what one second of
the watch costs: a tick of the peak tracker on one process, and the share of a memory reading
(one every SAMPLE_SECONDS).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORK = """
import time
start = time.perf_counter()
total = 0
for i in range({loops}):
    total += i * i % 7
print(f"{{time.perf_counter() - start:.4f}} {{time.process_time():.4f}}")
"""


def timed_run(script: Path, quiet: bool) -> tuple[float, float]:
    """(the script's own time for its work, the launcher's own CPU seconds for the run)."""
    command = [sys.executable, "-m", "mpslaunch", "launch", "--cpu", *(["-q"] if quiet else []),
               str(script)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    work, script_cpu = map(float, done.stdout.strip().splitlines()[-1].split())
    both = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return work, both - script_cpu


def per_call_seconds(function, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - start) / repeats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs with and without (default 7)")
    parser.add_argument("--loops", type=int, default=30_000_000,
                        help="iterations of the script's loop (default: about 3 s on one core)")
    options = parser.parse_args()
    script = Path(tempfile.mkdtemp(prefix="mpslaunch-bench-")) / "work.py"
    script.write_text(WORK.format(loops=options.loops))
    watched, quiet = [], []
    for _ in range(options.runs):  # in turn, so that a busy moment hits both alike
        watched.append(timed_run(script, quiet=False))
        quiet.append(timed_run(script, quiet=True))
    for index, what in ((0, "script's own time for its work"), (1, "launcher's own CPU time")):
        with_watch = statistics.median(run[index] for run in watched)
        without = statistics.median(run[index] for run in quiet)
        print(f"{what}, median of {options.runs}: with the watch {with_watch:.3f} s, without "
              f"{without:.3f} s, ratio {with_watch / without:.3f}")
        print("  with:    " + " ".join(f"{run[index]:.3f}" for run in watched))
        print("  without: " + " ".join(f"{run[index]:.3f}" for run in quiet))

    from mpslaunch.run import memory_watch
    from mpslaunch.run.summary import PeakTracker

    from mpslaunch.run.torchrun.signals import rank_pids

    reading = per_call_seconds(memory_watch.read_memory, 200)
    for what, processes in (("one process", lambda: [os.getpid()]),
                            ("several (the ranks found among the children)", rank_pids)):
        tick = per_call_seconds(PeakTracker(lambda: [os.getpid()]).tick, 1000)
        finding = per_call_seconds(processes, 200)
        per_second = (tick + finding / PeakTracker.REFRESH_SECONDS
                      + reading / memory_watch.SAMPLE_SECONDS)
        print(f"{what}: one tick {tick * 1e6:.0f} us, finding the processes {finding * 1e6:.0f} us "
              f"(every {PeakTracker.REFRESH_SECONDS:g} s), one reading {reading * 1e6:.0f} us "
              f"(every {memory_watch.SAMPLE_SECONDS:g} s): {per_second * 1e6:.0f} us of CPU per "
              f"second of run ({per_second * 100:.3f} % of a core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
