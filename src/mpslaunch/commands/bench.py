"""`mpslaunch bench`: every option is checked before the first measurement (bad input fails in
a second), then each (workload, dtype, size, device) point is measured in this process and
reported. torch is imported only once the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from mpslaunch import machine as machine_probe
from mpslaunch import output
from mpslaunch.machine import Machine
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import add_option

DEFAULT_SIZES = (256, 512, 1024, 2048, 4096, 8192)
DEFAULT_BATCH_SIZES = (32, 128, 512)
WORKLOADS = ("matvec", "matmul", "train")
EXIT_INTERRUPTED = 130
MAX_BUDGET_SECONDS = 86400
HELP = """\
Measure whether the accelerator (mps or cuda) is faster than the CPU at your sizes:
a matrix-vector product, a matrix product and one training step of a small CNN, on
cpu and every accelerator present. The table gives the time per op, its spread
(IQR, as a share of the median), GFLOP/s and the speedup over cpu; then, for each
workload, the size from which the accelerator wins. A point whose IQR is above half
its median is marked unreliable. Ctrl-C stops and reports what was measured.

examples:
  mpslaunch bench
  mpslaunch bench --workload matmul --dtype float32,bfloat16 --out results/
  mpslaunch bench --cpu --sizes 256,1024 --workload matvec --json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_argument_group("what to measure")
    add_option(
        what,
        "--workload",
        default="all",
        metavar="LIST",
        help=f"comma-separated workloads among {', '.join(WORKLOADS)}, or all "
        "(default: %(default)s)",
    )
    add_option(
        what,
        "--sizes",
        default=",".join(map(str, DEFAULT_SIZES)),
        metavar="LIST",
        help="matrix sizes m for matvec and matmul (default: %(default)s)",
    )
    add_option(
        what,
        "--batch_sizes",
        default=",".join(map(str, DEFAULT_BATCH_SIZES)),
        metavar="LIST",
        help="batch sizes for train (default: %(default)s)",
    )
    add_option(
        what,
        "--dtype",
        default="float32",
        metavar="LIST",
        help="comma-separated dtypes among float32, bfloat16, float16 (default: %(default)s)",
    )
    where = parser.add_argument_group(
        "where to measure (default: cpu and every accelerator present)"
    )
    add_option(
        where, "--devices", metavar="LIST", help="comma-separated devices among cpu, mps, cuda"
    )
    add_option(where, "--cpu", action="store_true", help="measure the cpu only")
    timing = parser.add_argument_group("how long")
    add_option(
        timing,
        "--repeats",
        type=int,
        default=7,
        metavar="N",
        help="timed samples per point (default: %(default)s)",
    )
    add_option(
        timing,
        "--warmup",
        type=int,
        default=2,
        metavar="N",
        help="untimed calls before the samples (default: %(default)s)",
    )
    add_option(
        timing,
        "--budget",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="time for the samples of one slow point; at least 3 samples are always "
        "taken (default: %(default)g)",
    )
    output = parser.add_argument_group("output (default: a table on stdout)")
    add_option(
        output,
        "--out",
        type=Path,
        metavar="DIR",
        help="also write DIR/bench.csv and DIR/bench.png (made, and checked writable, before measuring)",
    )
    add_option(
        output, "--json", action="store_true", help="print the results as JSON instead of the table"
    )


@dataclass(frozen=True)
class BenchOptions:
    workloads: tuple[str, ...]
    sizes: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    devices: tuple[str, ...]
    repeats: int
    warmup: int
    budget: float

    def sizes_for(self, workload: str) -> tuple[int, ...]:
        return self.batch_sizes if workload == "train" else self.sizes


def main(args: argparse.Namespace) -> int:
    from mpslaunch.bench import report as bench_report

    machine = machine_probe.probe()
    options = parse_options(args, machine)
    if options.devices == ("cpu",) and not args.cpu and args.devices is None:
        # Said before the minutes of measuring, not after. The cpu table still answers how fast
        # this machine is at each size, a baseline to set against another machine's run.
        output.warning(
            "this machine has no usable accelerator (mps or cuda), so there is nothing "
            "to compare the cpu with; measuring the cpu alone (--cpu asks for that "
            "without this warning)"
        )
    if args.out is not None:
        writable_folder(args.out)
    results, interrupted = run_all(options)
    environment = describe_environment(options.devices, machine)
    if args.json:
        bench_report.write_json(results, environment, sys.stdout)
    else:
        print(bench_report.format_table(results, environment))
    if args.out is not None:
        write_files(
            results, environment, args.out, report_to=sys.stderr if args.json else sys.stdout
        )
    if interrupted:
        output.say("bench interrupted: the results above are partial")
        if still_measuring():
            # Leave now: the interpreter's exit would tear torch down under the running op.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    return 0


def parse_options(args: argparse.Namespace, machine: Machine) -> BenchOptions:
    """Validate everything before the first measurement, so bad input fails in a second."""
    workloads = _parse_workloads(args.workload)
    sizes = _parse_sizes(args.sizes, "--sizes")
    batch_sizes = _parse_sizes(args.batch_sizes, "--batch-sizes")
    if args.repeats < 1 or args.warmup < 0 or not 0 < args.budget <= MAX_BUDGET_SECONDS:
        raise MpslaunchError(
            "--repeats must be at least 1, --warmup at least 0 and --budget above 0 seconds, "
            f"at most {MAX_BUDGET_SECONDS} (a day for one point)"
        )
    from mpslaunch.bench import (
        devices as bench_devices,  # imports torch: only once the cheap checks passed
    )

    dtypes = tuple(dict.fromkeys(bench_devices.canonical_dtype(d) for d in _split(args.dtype)))
    if not dtypes:
        raise MpslaunchError("--dtype is empty; pass e.g. --dtype float32,bfloat16")
    requested = _split(args.devices) if args.devices is not None else None
    if requested is not None and not requested:
        raise MpslaunchError("--devices is empty; pass e.g. --devices cpu,mps")
    devices = tuple(bench_devices.choose_devices(requested, args.cpu))
    for device in devices:
        for dtype in dtypes:
            bench_devices.check_dtype_supported(device, dtype, machine)
    return BenchOptions(
        workloads, sizes, batch_sizes, dtypes, devices, args.repeats, args.warmup, args.budget
    )


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _parse_workloads(text: str) -> tuple[str, ...]:
    names = _split(text)
    if names == ["all"]:
        return WORKLOADS
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        raise MpslaunchError(
            f"unknown workload {', '.join(map(repr, unknown)) or '(empty)'} in --workload; "
            f"choose from {', '.join(WORKLOADS)} or all"
        )
    return tuple(dict.fromkeys(names))


def _parse_sizes(text: str, flag: str) -> tuple[int, ...]:
    parts = _split(text)
    sizes = []
    for part in parts:
        if not part.isdigit() or int(part) < 1:
            raise MpslaunchError(
                f"{flag} takes positive whole numbers separated by commas "
                f"(e.g. {flag} 256,1024,4096); {part!r} is not one"
            )
        sizes.append(int(part))
    if not sizes:
        raise MpslaunchError(f"{flag} is empty; pass e.g. {flag} 256,1024,4096")
    return tuple(sorted(set(sizes)))


def measurement_plan(options: BenchOptions) -> list[tuple[str, str, int, str]]:
    """(workload, dtype, size, device) in run order: devices side by side, sizes ascending."""
    return [
        (workload, dtype, size, device)
        for workload in options.workloads
        for dtype in options.dtypes
        for size in options.sizes_for(workload)
        for device in options.devices
    ]


def run_all(options: BenchOptions):
    """Measure every planned point; Ctrl-C stops and returns what was measured so far.

    The points are measured in a thread of their own and this one only waits, so Ctrl-C is
    answered at once even in the middle of a long op (which Python cannot interrupt)."""
    from tqdm import tqdm

    from mpslaunch.bench import measure as bench_measure

    plan = measurement_plan(options)
    results, failure = [], []
    stop, finished = threading.Event(), threading.Event()

    def measure_all(bar) -> None:
        try:
            for workload, dtype, size, device in bar:
                if stop.is_set():
                    return
                bar.set_description(f"{workload} {dtype} {size} {device}")
                results.append(bench_measure.measure(workload, dtype, size, device, options))
        except BaseException as error:  # raised again in the waiting thread
            failure.append(error)
        finally:
            finished.set()

    # disable=None: no bar when stderr is not a terminal (CI logs, pipes).
    with tqdm(plan, file=sys.stderr, disable=None, unit="run", leave=False) as bar:
        threading.Thread(
            target=measure_all, args=(bar,), name="mpslaunch-bench", daemon=True
        ).start()
        try:
            while not finished.wait(0.1):
                pass
        except KeyboardInterrupt:
            stop.set()
            return list(results), True
    if failure:
        raise failure[0]
    return results, False


def still_measuring() -> bool:
    """A point is still running after Ctrl-C (an op Python cannot interrupt)."""
    return any(thread.name == "mpslaunch-bench" for thread in threading.enumerate())


def describe_environment(devices: tuple[str, ...], machine: Machine) -> dict[str, object]:
    import platform

    import torch

    from mpslaunch.bench import devices as bench_devices

    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "devices": {d: bench_devices.describe(d, machine) for d in devices},
        # "highest" means cuda float32 matmuls do not use TF32: the fp32 numbers are true fp32.
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def writable_folder(out: Path) -> None:
    """--out made and written to before the minutes of measuring, so that a file or a read-only
    place is refused at once rather than after the results exist."""
    import tempfile

    if out.exists() and not out.is_dir():
        raise MpslaunchError(
            f"--out {out} is not a folder; pass a folder for bench.csv and bench.png"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".mpslaunch-bench-"):
            pass
    except OSError as error:
        raise MpslaunchError(
            f"cannot write in the --out folder {out} ({error.strerror}); pass a writable folder"
        ) from None
    for name in ("bench.csv", "bench.png"):
        if (out / name).is_dir():
            raise MpslaunchError(f"{out / name} is a folder; pass another --out folder")


def write_files(results, environment, out: Path, report_to) -> None:
    from mpslaunch.bench import report as bench_report

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise MpslaunchError(
            f"cannot create the --out folder {out} ({error.strerror}); pass a writable folder"
        ) from None
    bench_report.write_csv(results, out / "bench.csv")
    bench_report.write_png(results, environment, out / "bench.png")
    print(f"wrote {out / 'bench.csv'} and {out / 'bench.png'}", file=report_to)
