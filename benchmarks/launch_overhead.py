"""Launch overhead and launcher memory: `mpslaunch launch` against `python` on the same script.

Two measures. In process: the launcher's own work from its first import to the moment it starts
the child (subprocess.Popen of the script), on the default path (no --cpu, no -q: the check
before launch and the companion on), on this machine, on a described CUDA machine (one H200, a
CUDA build of torch) and on a described Mac (an M4 Max on macOS 15.5 whose torch verdict on mps
is kept); each run a fresh Python, median of --in-process-runs. Whole process: `mpslaunch
launch pass.py` (default path) and `mpslaunch launch --cpu -q pass.py` against `python pass.py`,
where pass.py does nothing: the difference is the launcher's fixed cost; s.py imports torch,
like the start of any training script. The commands alternate, medians compared, with each
command's peak memory; the launcher's own peak memory beside a torch child is read while that
child runs. `--also-src DIR` measures another checkout's sources the same way, side by side;
`--instructions` also counts each in-process case's instructions under valgrind, a figure that
other work on the machine does not move; `--phases RUNS` times the default launch's steps (the
imports, the parser where options are given, the plan, the check, the runner) on this machine.
"""

from __future__ import annotations

import argparse
import ast
import json
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
MAC_BUILD = "24F74"

# The launcher in this process, told which machine it runs on the way the tests describe one,
# timed from its first import to the Popen of the script; the child is never started.
# argv: the script, the machine (this, cuda, mac), then launch's arguments.
IN_PROCESS = """
import time
start, cpu_start = time.perf_counter(), time.process_time()
import os, subprocess, sys
script, machine = sys.argv[1], sys.argv[2]
if machine in ("cuda", "mac"):
    from mpslaunch.machine import facts
if machine == "cuda":  # what /proc/driver/nvidia/gpus says, and torch/version.py's cuda
    facts._nvidia_gpu_names = lambda: ("NVIDIA H200",)
    read = facts._torch_build_facts
    facts._torch_build_facts = lambda: {**read(), "cuda": "13.0"}
if machine == "mac":  # os.uname and sysctl's answers
    os.uname = lambda: os.uname_result(("Darwin", "mac", "24.5.0", "", "arm64"))
    facts._mac_sysctls = lambda: {"kern.osproductversion": "15.5", "kern.osversion": "%s",
                                  "machdep.cpu.brand_string": "Apple M4 Max",
                                  "kern.hv_vmm_present": "0"}
real_popen = subprocess.Popen.__init__
def started(self, args, *rest, **named):
    if script in [str(arg) for arg in args]:
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        os.write(2, f"\\nMPSLAUNCH-BENCH {wall * 1000:.3f} {cpu * 1000:.3f}\\n".encode())
        os._exit(0)
    real_popen(self, args, *rest, **named)
subprocess.Popen.__init__ = started
if machine.startswith("floor"):  # Python alone starting the script: what any launcher pays
    if machine == "floor-ctypes":  # and libc's prctl loaded, as for Linux's parent-death signal
        import ctypes
        ctypes.CDLL(None).prctl
    subprocess.Popen([sys.executable, script])
from mpslaunch.commands import main
main(["launch", *sys.argv[3:], script])
raise SystemExit("the launcher did not start the script")
""" % MAC_BUILD

# Where the in-process time goes on this machine's default path: the clock read at each step
# (the harness imports subprocess first, as the floor does). argv: the script.
PHASES = """
import time
import os, subprocess, sys
marks = [("start", time.perf_counter())]
def mark(name):
    marks.append((name, time.perf_counter()))
real_popen = subprocess.Popen.__init__
def started(self, args, *rest, **named):
    if sys.argv[1] in [str(arg) for arg in args]:
        mark("the runner: its modules, ctypes, handlers, Popen")
        steps = [(name, (at - before) * 1000) for (_, before), (name, at) in zip(marks, marks[1:])]
        os.write(2, f"\\nMPSLAUNCH-PHASES {steps!r}\\n".encode())
        os._exit(0)
    real_popen(self, args, *rest, **named)
subprocess.Popen.__init__ = started
from mpslaunch import commands; mark("import mpslaunch.commands (with argparse, if it needs it)")
from mpslaunch.commands import launch; mark("launch's modules: settings, plan, machine")
from mpslaunch.check import before_launch; mark("the check's modules")
from mpslaunch import launcher
def wrapped(name, function, before=None):
    def call(*args, **named):
        if before:
            mark(before)
        result = function(*args, **named)
        mark(name)
        return result
    return call
commands.build_parser = wrapped("the launch parser (none without options)", commands.build_parser)
launcher.prepare = wrapped("the plan", launcher.prepare, "reading the command line")
before_launch.warn = wrapped("the check, of a script seen before", before_launch.warn)
launcher.announce = wrapped("the plan line", launcher.announce)
commands.main(["launch", sys.argv[1]])
"""

# Keeps torch's verdict "mps works" for the described Mac, as a first launch there would.
KEEP_MPS_VERDICT = """
import sys
from mpslaunch.machine import probe, torch_check
key = torch_check.cache_key(sys.executable, probe().torch_version, "%s")
torch_check.save(key, torch_check.MpsAnswer(True, "works", "", "2026-01-01 00:00"))
""" % MAC_BUILD

MACHINES = {"this": "this machine", "cuda": "described CUDA machine (1 x H200)",
            "mac": "described Mac (M4 Max, macOS 15.5)"}


def mpslaunch_command() -> list[str]:
    found = shutil.which("mpslaunch", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "mpslaunch"]


def isolated_environment(folder: Path, src: str | None) -> dict[str, str]:
    """This environment with the user's config and cache folders in `folder` (found the way the
    launcher finds them, not through MPSLAUNCH_*_DIR), outside any cluster, the sources in `src`."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SLURM_", "PET_", "MPSLAUNCH_"))}
    env.update(XDG_CONFIG_HOME=str(folder / "config"), XDG_CACHE_HOME=str(folder / "cache"))
    if src:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()),
                                             *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def in_process_ms(script: Path, machine: str, flags: list[str],
                  env: dict[str, str]) -> tuple[float, float]:
    """Milliseconds from the launcher's first import to the child's Popen: wall-clock, and the
    CPU time the launcher's process spent meanwhile (steadier on a machine others load)."""
    done = subprocess.run([sys.executable, "-c", IN_PROCESS, str(script), machine, *flags],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    marked = [line for line in done.stderr.splitlines() if line.startswith("MPSLAUNCH-BENCH ")]
    if not marked:
        raise SystemExit(f"the in-process run on {machine} failed:\n{done.stderr}")
    wall, cpu = marked[-1].split()[1:]
    return float(wall), float(cpu)


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


def run_once(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Seconds from start to exit, and the peak resident memory in MB of the command's process
    (or of a child it waited for, when that one was bigger)."""
    done = subprocess.run([sys.executable, "-S", "-c", RUNNER, *command], capture_output=True,
                          text=True, check=True, env=env)
    elapsed, peak, code = done.stdout.split()
    if int(code) != 0:
        raise SystemExit(f"{command} failed with exit code {code}")
    per_mb = 1024 * 1024 if sys.platform == "darwin" else 1024  # bytes on macOS, KB on Linux
    return float(elapsed), int(peak) / per_mb


def launcher_peak_rss_mb(command: list[str], env: dict[str, str]) -> float:
    """Peak resident memory of the launcher process itself, read while its child still runs."""
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env)
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


def in_process(sources: dict[str, str | None], folder: Path, script: Path, runs: int) -> None:
    """The launcher's own time to the child's start, per machine and per checkout, in turn, and
    beside it Python alone importing subprocess to start the script (the floor)."""
    envs = {label: isolated_environment(folder / label, src) for label, src in sources.items()}
    for env in envs.values():
        subprocess.run([sys.executable, "-c", KEEP_MPS_VERDICT], env=env, check=True)
    first = next(iter(sources))
    cases = [(first, "floor", ""), (first, "floor-ctypes", "")] + [
        (label, machine, flags) for label in sources for machine in MACHINES
        for flags in ("", "--cpu -q")]
    samples = {case: [] for case in cases}
    for label, machine, flags in cases:  # warm up: the check keeps its findings, files cached
        in_process_ms(script, machine, flags.split(), envs[label])
    for _ in range(runs):
        for label, machine, flags in cases:
            samples[(label, machine, flags)].append(
                in_process_ms(script, machine, flags.split(), envs[label]))

    def shown(case) -> str:
        walls, cpus = [wall for wall, _ in samples[case]], [cpu for _, cpu in samples[case]]
        return (f"{statistics.median(walls):6.1f} ({min(walls):5.1f}) "
                f"{statistics.median(cpus):6.1f}")

    print(f"\nin process, ms from the launcher's first import to the child's Popen: wall-clock "
          f"median (min) and CPU-time median, of {runs}; columns: {', '.join(sources)}")
    print(f"  {'Python alone, importing subprocess':50}  {shown((first, 'floor', ''))}")
    print(f"  {'... and ctypes with libc prctl (Linux)':50}  {shown((first, 'floor-ctypes', ''))}")
    for machine, name in MACHINES.items():
        for flags in ("", "--cpu -q"):
            path = flags or "default path"
            print(f"  {name:37} {path:12}  "
                  + "   ".join(shown((label, machine, flags)) for label in sources))


def instructions_millions(script: Path, machine: str, flags: list[str], env: dict[str, str]) -> float:
    """Millions of instructions one in-process run executes, from Python's start to the child's
    Popen (valgrind's callgrind): the same on a loaded machine as on a quiet one. A run that
    forks on the way (pmset on the described Mac) reports each process: the launcher's is the
    largest."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                           sys.executable, "-c", IN_PROCESS, str(script), machine, *flags],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    counts = [int(line.split()[-1].replace(",", "")) for line in done.stderr.splitlines()
              if "Collected :" in line]
    if "MPSLAUNCH-BENCH " not in done.stderr or not counts:
        raise SystemExit(f"the run under valgrind on {machine} failed:\n{done.stderr[-2000:]}")
    return max(counts) / 1e6


def instructions(sources: dict[str, str | None], folder: Path, script: Path) -> None:
    """The in-process cases counted in instructions (one run each, after a warm-up), per checkout."""
    envs = {label: isolated_environment(folder / f"{label}-instructions", src)
            for label, src in sources.items()}
    for env in envs.values():
        subprocess.run([sys.executable, "-c", KEEP_MPS_VERDICT], env=env, check=True)
    first = next(iter(sources))
    print(f"\ninstructions from Python's start to the child's Popen, millions (callgrind); "
          f"columns: {', '.join(sources)}")
    for machine, name, flags in [("floor", "Python alone, importing subprocess", ""),
                                 ("floor-ctypes", "... and ctypes with libc prctl (Linux)", "")] + [
            (machine, f"{name:37} {flags or 'default path':12}", flags)
            for machine, name in MACHINES.items() for flags in ("", "--cpu -q")]:
        counts = []
        for label in (sources if not machine.startswith("floor") else [first]):
            in_process_ms(script, machine, flags.split(), envs[label])  # the findings kept
            counts.append(instructions_millions(script, machine, flags.split(), envs[label]))
        print(f"  {name:50}  " + "   ".join(f"{count:7.1f}" for count in counts))


INTERPRETER_START = ("site", "encodings", "_frozen_importlib_external", "zipimport", "codecs")


def import_times(sources: dict[str, str | None], folder: Path, script: Path, runs: int,
                 shown: int = 12) -> None:
    """`python -X importtime` of the default launch on this machine: the imports that cost most,
    their cumulative times (median of `runs`), per checkout."""
    for label, src in sources.items():
        env = isolated_environment(folder / label, src)
        times: dict[str, list[int]] = {}
        for _ in range(runs):
            done = subprocess.run([sys.executable, "-X", "importtime", "-c", IN_PROCESS,
                                   str(script), "this"], capture_output=True, text=True, env=env)
            for line in done.stderr.splitlines():
                if line.startswith("import time:") and "self [us]" not in line:
                    _, cumulative, name = line[len("import time:"):].split("|")
                    times.setdefault(name.rstrip(), []).append(int(cumulative))
        medians = {name: statistics.median(values) for name, values in times.items()
                   if len(values) == runs and name.strip() not in INTERPRETER_START}
        print(f"\n-X importtime, {label}, this machine, default path: the {shown} largest "
              f"cumulative times, ms (median of {runs}; the harness imports subprocess first)")
        for name, micros in sorted(medians.items(), key=lambda item: -item[1])[:shown]:
            print(f"  {micros / 1000:6.1f}  {name}")


def phases(sources: dict[str, str | None], folder: Path, script: Path, runs: int) -> None:
    """The in-process time of the default launch on this machine, step by step: medians of
    `runs` fresh Pythons, per checkout."""
    found: dict[str, dict[str, list[float]]] = {}
    steps: list[str] = []  # in the order of the checkout with the most steps
    for label, src in sources.items():
        env = isolated_environment(folder / f"{label}-phases", src)
        for run in range(runs + 1):  # the first keeps the check's findings, and is not counted
            done = subprocess.run([sys.executable, "-c", PHASES, str(script)],
                                  capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
            marked = [line for line in done.stderr.splitlines()
                      if line.startswith("MPSLAUNCH-PHASES ")]
            if not marked:
                raise SystemExit(f"the phases run failed:\n{done.stderr}")
            timed = ast.literal_eval(marked[-1].split(" ", 1)[1]) if run else []
            for name, milliseconds in timed:
                found.setdefault(name, {}).setdefault(label, []).append(milliseconds)
            steps = max(steps, [name for name, _ in timed], key=len)
    print(f"\nwhere the in-process time goes, this machine, default path: ms, median of {runs}; "
          "columns: " + ", ".join(sources))
    totals = dict.fromkeys(sources, 0.0)
    for name in steps:
        by_label = found[name]
        medians = {label: statistics.median(by_label[label]) for label in by_label}
        for label, value in medians.items():
            totals[label] += value
        print(f"  {name:50}  " + "   ".join(
            f"{medians[label]:6.2f}" if label in medians else f"{'-':>6}" for label in sources))
    print(f"  {'sum of the medians':50}  " + "   ".join(f"{totals[label]:6.2f}" for label in sources))


def whole_process(sources: dict[str, str | None], folder: Path, runs: int,
                  with_accelerate: bool) -> None:
    script, sleepy, nothing = folder / "s.py", folder / "sleepy.py", folder / "pass.py"
    plain_env = isolated_environment(folder / "plain", None)
    # With --also-src every launcher runs as `python -m mpslaunch`, each finding its own sources.
    launcher = [sys.executable, "-m", "mpslaunch"] if len(sources) > 1 else mpslaunch_command()
    commands = {
        "python pass.py": ([sys.executable, str(nothing)], plain_env),
        "python s.py": ([sys.executable, str(script)], plain_env),
    }
    for label, src in sources.items():
        env = isolated_environment(folder / label, src)
        tag = f" ({label})" if len(sources) > 1 else ""
        commands[f"mpslaunch launch pass.py{tag}"] = ([*launcher, "launch", str(nothing)], env)
        commands[f"mpslaunch launch --cpu -q pass.py{tag}"] = (
            [*launcher, "launch", "--cpu", "-q", str(nothing)], env)
        commands[f"mpslaunch launch --cpu -q s.py{tag}"] = (
            [*launcher, "launch", "--cpu", "-q", str(script)], env)
    if with_accelerate:
        accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
        commands["accelerate launch --cpu s.py"] = ([accelerate, "launch", "--cpu", str(script)],
                                                    plain_env)
    for command, env in commands.values():
        run_once(command, env)  # warm the file cache; the check keeps its findings
    samples = {name: [] for name in commands}
    for _ in range(runs):
        for name, (command, env) in commands.items():
            samples[name].append(run_once(command, env))
    width = max(map(len, samples))
    print(f"\nwhole process ({runs} alternating runs):")
    print(f"{'command':{width}} {'median s':>9} {'ratio':>6} {'peak MB':>8}")
    medians = {name: statistics.median(s for s, _ in runs_) for name, runs_ in samples.items()}
    for name, runs_ in samples.items():
        base = "python pass.py" if "pass.py" in name else "python s.py"
        peak = statistics.median(megabytes for _, megabytes in runs_)
        print(f"{name:{width}} {medians[name]:9.3f} {medians[name] / medians[base]:6.3f} {peak:8.1f}")
    for name in [name for name in samples if "launch" in name and "pass.py" in name]:
        print(f"the launcher's fixed cost, {name} - python pass.py: "
              f"{(medians[name] - medians['python pass.py']) * 1000:.0f} ms")
    env = isolated_environment(folder / next(iter(sources)), next(iter(sources.values())))
    peak = launcher_peak_rss_mb([*launcher, "launch", "--cpu", "-q", str(sleepy)], env)
    print(f"launcher peak RSS (mpslaunch process only): {peak:.1f} MB")
    if with_accelerate:
        peak = launcher_peak_rss_mb([commands["accelerate launch --cpu s.py"][0][0], "launch",
                                     "--cpu", str(sleepy)], plain_env)
        print(f"launcher peak RSS (accelerate process only): {peak:.1f} MB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7,
                        help="whole-process runs of each command (default: 7)")
    parser.add_argument("--in-process-runs", type=int, default=30,
                        help="in-process runs of each case (default: 30)")
    parser.add_argument("--with-accelerate", action="store_true",
                        help="also time `accelerate launch --cpu s.py`")
    parser.add_argument("--also-src", metavar="DIR",
                        help="also measure the mpslaunch in DIR (another checkout's src/), side by side")
    parser.add_argument("--importtime", type=int, default=0, metavar="RUNS",
                        help="also show the costliest imports of the default launch (-X importtime)")
    parser.add_argument("--phases", type=int, default=0, metavar="RUNS",
                        help="also time the default launch's steps (imports, parser, plan, check, "
                             "start), median of RUNS")
    parser.add_argument("--only", choices=("in-process", "whole"),
                        help="run one of the two measures")
    parser.add_argument("--instructions", action="store_true",
                        help="also count the in-process cases' instructions (valgrind): steady "
                             "where other work loads the machine")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mpslaunch-bench-"))
    for name, text in (("s.py", SCRIPT), ("sleepy.py", SLEEPY_SCRIPT), ("pass.py", NOTHING)):
        (folder / name).write_text(text)
    here = str(Path(__file__).resolve().parents[1] / "src")
    sources = {"this checkout": here}
    if options.also_src:
        sources["--also-src"] = options.also_src
    print(json.dumps({"python": sys.version.split()[0], "cores": os.cpu_count(),
                      "load average": os.getloadavg()}))
    try:
        if options.only != "whole":
            in_process(sources, folder, folder / "pass.py", options.in_process_runs)
            if options.phases:
                phases(sources, folder, folder / "pass.py", options.phases)
            if options.importtime:
                import_times(sources, folder, folder / "pass.py", options.importtime)
            if options.instructions:
                instructions(sources, folder, folder / "pass.py")
        if options.only != "in-process":
            whole_process(sources, folder, options.runs, options.with_accelerate)
        print(json.dumps({"load average": os.getloadavg()}))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
