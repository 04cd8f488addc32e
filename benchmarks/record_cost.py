"""What `mpslaunch.record` costs a launch: defining the records the default `mpslaunch launch`
path defines, and making and reading them.

Each run is a fresh Python that wraps `mpslaunch.record` in a clock and runs `mpslaunch launch
pass.py` in process up to the child's Popen (the child is never started), on this machine's
default path. It prints the records that path defined and the time spent in `record`; then, in
the same process, `record` applied again to those same classes (as written, before the
decorator) --repeat times, and the time to make and read a few of them. `--also-src DIR` measures
another checkout's sources the same way; the checkouts alternate, medians are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# argv: the script, then --repeat. Prints one json line on stderr, then ends at the Popen.
CHILD = """
import json, os, subprocess, sys, time, timeit
import mpslaunch
script, repeat = sys.argv[1], int(sys.argv[2])
real, written, spent = mpslaunch.record, [], [0]
def clocked(cls):
    start = time.perf_counter_ns()
    made = real(cls)
    spent[0] += time.perf_counter_ns() - start
    written.append(cls)
    return made
mpslaunch.record = clocked

def measured():
    names = [cls.__name__ for cls in written]
    start = time.perf_counter_ns()
    for _ in range(repeat):
        for cls in written:
            real(cls)
    again = (time.perf_counter_ns() - start) / repeat
    from mpslaunch.settings import LaunchRequest, Profile
    from mpslaunch.machine.torch_check import MpsAnswer
    profile, number = Profile(), 20000
    per = lambda code: timeit.timeit(code, number=number, globals=locals()) / number * 1e9
    return {
        "records": names, "launch_us": spent[0] / 1000, "again_us": again / 1000,
        "Profile()": per(lambda: Profile()),
        "Profile(device=..., num_processes=...)": per(lambda: Profile(device="cpu", num_processes=2)),
        "MpsAnswer(4 positional)": per(lambda: MpsAnswer(True, "works", "", "now")),
        "LaunchRequest(target, cpu=True)": per(lambda: LaunchRequest("s.py", cpu=True)),
        "profile.device": per(lambda: profile.device),
        "profile._replace(device=...)": per(lambda: profile._replace(device="cpu")),
    }

real_popen = subprocess.Popen.__init__
def started(self, args, *rest, **named):
    if script in [str(arg) for arg in args]:
        os.write(2, ("\\nRECORD-BENCH " + json.dumps(measured()) + "\\n").encode())
        os._exit(0)
    real_popen(self, args, *rest, **named)
subprocess.Popen.__init__ = started
from mpslaunch.commands import main
main(["launch", script])
raise SystemExit("the launcher did not start the script")
"""


def one_run(script: Path, env: dict[str, str], repeat: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(script), str(repeat)],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    marked = [line for line in done.stderr.splitlines() if line.startswith("RECORD-BENCH ")]
    if not marked:
        raise SystemExit(f"the run failed:\n{done.stderr}")
    return json.loads(marked[-1].split(" ", 1)[1])


def environment(folder: Path, src: str) -> dict[str, str]:
    """This environment with fresh config and cache folders, outside any cluster, `src` first."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SLURM_", "PET_", "MPSLAUNCH_"))}
    env.update(XDG_CONFIG_HOME=str(folder / "config"), XDG_CACHE_HOME=str(folder / "cache"),
               PYTHONPATH=str(Path(src).resolve()))
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="fresh Pythons per checkout (15)")
    parser.add_argument("--repeat", type=int, default=200,
                        help="times `record` is applied again to the launch's classes (200)")
    parser.add_argument("--also-src", metavar="DIR",
                        help="also measure the mpslaunch in DIR (another checkout's src/)")
    options = parser.parse_args()
    sources = {"this checkout": str(Path(__file__).resolve().parents[1] / "src")}
    if options.also_src:
        sources["--also-src"] = options.also_src
    folder = Path(tempfile.mkdtemp(prefix="mpslaunch-record-"))
    (folder / "pass.py").write_text("pass\n")
    envs = {label: environment(folder / str(number), src)
            for number, (label, src) in enumerate(sources.items())}
    print(json.dumps({"python": sys.version.split()[0], "cores": os.cpu_count(),
                      "load average": os.getloadavg()}))
    try:
        for env in envs.values():  # warm up: the check keeps its findings
            one_run(folder / "pass.py", env, 1)
        samples: dict[str, list[dict]] = {label: [] for label in sources}
        for _ in range(options.runs):
            for label, env in envs.items():
                samples[label].append(one_run(folder / "pass.py", env, options.repeat))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for label, runs in samples.items():
        print(f"{label}: {len(runs[0]['records'])} records on the launch path: "
              + ", ".join(runs[0]["records"]))
    keys = [key for key in samples[next(iter(sources))][0] if key != "records"]
    print(f"\nmedians of {options.runs} runs; columns: {', '.join(sources)}")
    for key in keys:
        unit = "us" if key.endswith("_us") else "ns"
        name = {"launch_us": "time in record during the launch",
                "again_us": f"record applied again to those classes (mean of {options.repeat})"
                }.get(key, key)
        print(f"  {name:62} {unit}  " + "   ".join(
            f"{statistics.median(run[key] for run in runs):8.1f}" for runs in samples.values()))
    print(json.dumps({"load average": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
