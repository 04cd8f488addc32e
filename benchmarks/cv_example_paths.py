"""Where an example's end-to-end rate goes: the same example run several ways, the ways taking
turns, beside the pure step and the in-process loop of cv_data_path.py.

Ways (`--ways`, comma-separated):

  launch         through `mpslaunch launch`, one process, as cv_throughput.py runs it;
  python         `python example.py --mixed_precision ...`: no launcher;
  no_eval        through the launcher, a copy of the example that skips its evaluation (its
                 evaluation loader's workers never start);
  eval_stops     through the launcher, a copy whose evaluation loader's workers stop after each
                 evaluation (not persistent);
  workers_N      through the launcher with `--num_workers N`;
  complete       complete_cv_example.py (or `--complete`) through the launcher.

Each run trains `--epochs` epochs; reported: every epoch's training images/s as the example
prints it, the mean of the epochs after the first (the first also starts the workers and picks
the kernels), over the pure step (cv_throughput.py's, in a process of its own, once a round),
and the share of the machine's CPU time busy while the run lasted. Once, between the rounds,
cv_data_path.py trains the example's loader as built in one process (`--in_process_epochs`).
Runs that would end after `--deadline` seconds are left out (and said so).

    PYTHONPATH=src python3 benchmarks/cv_example_paths.py --scenario photos --model resnet50 \\
        --mixed_precision bf16

Exit code 0 when every run trained, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cv_throughput  # the images, the pure step, the epoch line

REPO = Path(__file__).resolve().parents[1]
# Text each copy of the example replaces, and with what: an example that no longer holds the
# text stops the run (the copy would measure the example unchanged).
EDITS = {
    "no_eval": ("accuracies.append(evaluate(accelerator, model, eval_loader))",
                "accuracies.append(0.0)"),
    "eval_stops": ("eval_loader = DataLoader(datasets[1], **options)",
                   'eval_loader = DataLoader(datasets[1], **{**options, "persistent_workers": False})'),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", type=Path, default=REPO / "examples" / "cv_example.py")
    parser.add_argument("--complete", type=Path,
                        default=REPO / "examples" / "complete_cv_example.py")
    parser.add_argument("--ways", default="launch,python,no_eval,complete")
    parser.add_argument("--later_ways", default="",
                        help="ways run after the rounds, while the deadline allows")
    cv_throughput.add_job_arguments(parser)
    parser.add_argument("--epochs", type=int, default=3, help="of each run")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of the ways")
    parser.add_argument("--seconds", type=float, default=6.0, help="of each pure-step run")
    parser.add_argument("--in_process_epochs", type=int, default=4,
                        help="of cv_data_path.py's loop (0: none)")
    parser.add_argument("--deadline", type=float, default=420.0, help="seconds for it all")
    parser.add_argument("--json", type=Path, help="also write every run here")
    return parser.parse_args(argv)


def busy_ticks() -> tuple[int, int] | None:
    """(busy, all) CPU ticks of the whole machine since boot; None without /proc."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except OSError:
        return None
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def edited_copy(example: Path, way: str, folder: Path) -> Path:
    old, new = EDITS[way]
    text = example.read_text()
    if old not in text:
        raise RuntimeError(f"{example} no longer holds {old!r}: update EDITS[{way!r}]")
    copy = folder / way / example.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(text.replace(old, new))
    return copy


def command_for(args, way: str, data_dir: Path, output: str, copies: dict) -> list[str]:
    example = {"complete": args.complete.resolve(), **copies}.get(way, args.example.resolve())
    job = ["--data_dir", str(data_dir), "--model", args.model, "--batch_size",
           str(args.batch_size), "--image_size", str(args.image_size), "--num_epochs",
           str(args.epochs), "--output_dir", output]
    if way.startswith("workers_"):
        job += ["--num_workers", way.removeprefix("workers_")]
    if way == "python":
        return [sys.executable, str(example), *job, "--mixed_precision", args.mixed_precision,
                *(["--cpu"] if args.cpu else [])]
    return [sys.executable, "-m", "mpslaunch", "launch", "--num_processes", "1",
            "--mixed_precision", args.mixed_precision, *(["--cpu"] if args.cpu else []),
            str(example), *job]


def run_way(args, way: str, data_dir: Path, copies: dict) -> dict:
    with tempfile.TemporaryDirectory() as output, tempfile.TemporaryDirectory() as config:
        path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
        before, started = busy_ticks(), time.perf_counter()
        result = subprocess.run(command_for(args, way, data_dir, output, copies),
                                check=False, capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": path,
                                     "MPSLAUNCH_CONFIG_DIR": config})
        seconds, after = time.perf_counter() - started, busy_ticks()
    if result.returncode != 0:
        raise RuntimeError(f"{way} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    epochs = [float(rate.replace(",", "")) for *_, rate in
              cv_throughput.EPOCH_LINE.findall(result.stdout)]
    busy = (after[0] - before[0]) / max(1, after[1] - before[1]) if before and after else None
    return {"way": way, "epochs": epochs, "seconds": seconds, "cpu_busy": busy}


def pure_step(args, data_dir: Path, classes: int) -> float:
    return cv_throughput.run_worker(args, "pure_step", args.example, data_dir, args.image_size,
                                    classes)["images_per_second"]


def in_process(args) -> str:
    command = [sys.executable, str(REPO / "benchmarks" / "cv_data_path.py"), "--example",
               str(args.example), "--scenario", args.scenario, "--model", args.model,
               "--batch_size", str(args.batch_size), "--image_size", str(args.image_size),
               "--mixed_precision", args.mixed_precision, "--data_root", str(args.data_root),
               "--only", "as built", "--epochs", str(args.in_process_epochs), "--rounds", "3",
               *(["--images", str(args.images)] if args.images else []),
               *(["--cpu"] if args.cpu else [])]
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"cv_data_path.py failed:\n{result.stderr[-3000:]}")
    return result.stdout


def report(runs: list[dict], pures: list[float]) -> str:
    pure = max(pures) if pures else float("nan")
    lines = [f"pure step (each round): {', '.join(f'{p:,.0f}' for p in pures)} images/s",
             (f"{'way':12} {'epochs after the 1st: mean':>27} {'ratio':>5}  every run's epochs "
              "(images/s), seconds, CPU busy")]
    for way in dict.fromkeys(run["way"] for run in runs):
        mine = [run for run in runs if run["way"] == way]
        later = [rate for run in mine for rate in run["epochs"][1:]]
        mean = statistics.mean(later) if later else float("nan")
        each = "; ".join(
            f"{' '.join(f'{e:,.0f}' for e in run['epochs'])} ({run['seconds']:.0f} s"
            + (f", {run['cpu_busy']:.0%})" if run["cpu_busy"] is not None else ")")
            for run in mine)
        lines.append(f"{way:12} {mean:>27,.0f} {mean / pure:>5.2f}  {each}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    import torch
    args.cpu = args.cpu or not torch.cuda.is_available()
    data_dir, classes = cv_throughput.make_images(args)
    args.image_size = args.image_size or (224 if args.scenario == "photos" else 64)
    print(f"{os.cpu_count()} CPUs, torch {torch.__version__}; images ready after "
          f"{time.perf_counter() - began:.0f} s", flush=True)
    runs, pures, durations = [], [], {}

    def fits(name: str) -> bool:
        left = args.deadline - (time.perf_counter() - began)
        if left > durations.get(name, 0) * 1.2 + 5:
            return True
        print(f"left out: {name} ({left:.0f} s left)", flush=True)
        return False

    def timed(name: str, work):
        started = time.perf_counter()
        value = work()
        durations[name] = time.perf_counter() - started
        return value

    def one(way: str) -> None:
        if fits(way):
            run = timed(way, lambda: run_way(args, way, data_dir, copies))
            runs.append(run)
            print(f"{way}: {json.dumps(run)}", flush=True)

    def pure() -> None:
        if fits("pure"):
            pures.append(timed("pure", lambda: pure_step(args, data_dir, classes)))
            print(f"pure step: {pures[-1]:,.0f} images/s", flush=True)

    ways = [way for way in args.ways.split(",") if way]
    later = [way for way in args.later_ways.split(",") if way]
    with tempfile.TemporaryDirectory() as folder:
        copies = {way: edited_copy(args.example.resolve(), way, Path(folder))
                  for way in {*ways, *later} & set(EDITS)}
        try:
            for repeat in range(args.repeats):
                for way in ways:
                    one(way)
                pure()
                if repeat == 0 and args.in_process_epochs and fits("in process"):
                    print(timed("in process", lambda: in_process(args)), flush=True)
            for way in later:
                one(way)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
    print(report(runs, pures))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "pure": pures}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
