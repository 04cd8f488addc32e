"""Tests for `mpslaunch bench`: cpu runs with tiny sizes, timing logic, report logic, errors."""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mpslaunch.commands import bench as bench
from mpslaunch.bench import devices as bench_devices
from mpslaunch.bench import measure as bench_measure
from mpslaunch.bench import report as bench_report
from mpslaunch.bench import timing as bench_timing
from mpslaunch.bench import workloads as bench_workloads
from mpslaunch.bench.report import (
    CSV_COLUMNS, DOES_NOT_FIT, FAILED, OK, Result, crossovers, format_table, speedups,
)
from mpslaunch.bench.timing import Timing
from mpslaunch.output import MpslaunchError
from helpers import MACHINES, one_line_error, read_only_disk, run_cli

TINY = ["--cpu", "--sizes", "16,32,64", "--batch-sizes", "2,4", "--repeats", "3",
        "--warmup", "1", "--budget", "0.5"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def run_bench(argv: list[str], capsys) -> tuple[int, str]:
    code = bench.main(parse(argv))
    return code, capsys.readouterr().out


# ---- end to end on cpu ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    assert bench.main(parse([*TINY, "--out", str(out)])) == 0
    return out


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def test_csv_has_the_documented_columns_and_one_row_per_point(tiny_run):
    columns, rows = read_csv(tiny_run / "bench.csv")
    assert columns == list(CSV_COLUMNS)
    points = {(r["workload"], r["size"]) for r in rows}
    assert points == {("matvec", "16"), ("matvec", "32"), ("matvec", "64"),
                      ("matmul", "16"), ("matmul", "32"), ("matmul", "64"),
                      ("train", "2"), ("train", "4")}
    assert {r["device"] for r in rows} == {"cpu"}
    assert {r["dtype"] for r in rows} == {"float32"}


def test_csv_numbers_are_positive_and_ordered(tiny_run):
    _, rows = read_csv(tiny_run / "bench.csv")
    for row in rows:
        assert row["status"] == OK, row
        p25, median, p75 = float(row["p25_s"]), float(row["median_s"]), float(row["p75_s"])
        assert 0 < p25 <= median <= p75
        assert float(row["flops"]) > 0 and float(row["gflops"]) > 0
        assert int(row["samples"]) >= 3 and int(row["inner"]) >= 1
        assert row["speedup_vs_cpu"] == ""  # no accelerator measured


def test_png_is_a_valid_image(tiny_run):
    from PIL import Image

    path = tiny_run / "bench.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        width, height = image.size
    assert width > 500 and height > 500


def test_table_lists_every_point(capsys):
    code, out = run_bench([*TINY, "--workload", "matvec", "--dtype", "fp32,bf16"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("torch ")
    assert lines[1].split() == ["workload", "dtype", "size", "device", "time/op", "IQR",
                                "GFLOP/s", "speedup"]
    body = [line.split() for line in lines[2:8]]
    assert [(b[1], b[2]) for b in body] == [
        ("float32", "m=16"), ("float32", "m=32"), ("float32", "m=64"),
        ("bfloat16", "m=16"), ("bfloat16", "m=32"), ("bfloat16", "m=64"),
    ]


def test_json_output_is_machine_readable(capsys):
    code, out = run_bench([*TINY, "--workload", "matmul", "--sizes", "16", "--json"], capsys)
    assert code == 0
    document = json.loads(out)
    assert set(document) == {"environment", "results", "crossovers"}
    assert document["environment"]["devices"].keys() == {"cpu"}
    [row] = document["results"]
    assert row["status"] == OK and row["median_s"] > 0 and row["gflops"] > 0


def test_a_size_that_does_not_fit_is_reported_and_the_sweep_goes_on(tmp_path, capsys):
    # 10^6 x 10^6 float32 is 4 TB: refused from the free-memory check, never allocated.
    code, out = run_bench([*TINY, "--workload", "matvec", "--sizes", "16,1000000",
                           "--out", str(tmp_path)], capsys)
    assert code == 0
    assert "does not fit: needs" in out
    _, rows = read_csv(tmp_path / "bench.csv")
    assert [(r["size"], r["status"], r["median_s"]) for r in rows][1] == (
        "1000000", DOES_NOT_FIT, "")
    assert rows[0]["status"] == OK


# ---- one point: out-of-memory and other failures ---------------------------------------------

OPTIONS = bench.BenchOptions(("matmul",), (16,), (2,), ("float32",), ("cpu",), 3, 1, 0.5)


def test_out_of_memory_during_the_run_is_does_not_fit(monkeypatch):
    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(bench_measure.workloads, "prepare", out_of_memory)
    result = bench_measure.measure("matmul", "float32", 16, "cpu", OPTIONS)
    assert (result.status, result.timing) == (DOES_NOT_FIT, None)


def test_another_runtime_error_is_reported_as_failed(monkeypatch):
    def no_kernel(*args):
        raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'\nmore detail')

    monkeypatch.setattr(bench_measure.workloads, "prepare", no_kernel)
    result = bench_measure.measure("matmul", "float32", 16, "cpu", OPTIONS)
    assert result.status == FAILED
    assert result.note == "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'"


def test_a_train_batch_that_does_not_fit_is_refused_before_anything_is_allocated(monkeypatch):
    """A huge batch would grow until the OOM killer came: refused from the free memory, as a
    huge matrix is."""
    def allocates(*args):
        raise AssertionError("the point was allocated")

    monkeypatch.setattr(bench_measure.devices, "free_bytes", lambda device: 4 * 1024**3)
    monkeypatch.setattr(bench_measure.workloads, "prepare", allocates)
    result = bench_measure.measure("train", "float32", 100_000, "cpu", OPTIONS)
    assert result.status == DOES_NOT_FIT
    assert result.note.startswith("needs ") and result.note.endswith("4.0 GiB free")


def test_the_train_estimate_grows_with_the_batch_and_covers_the_images():
    small, large = (bench_workloads.bytes_needed("train", "float32", n) for n in (32, 32_000))
    assert 0 < small < large
    assert large > 32_000 * 3 * 32 * 32 * 4 * 2  # more than the images and their gradient


@pytest.mark.parametrize("error, expected", [
    (torch.OutOfMemoryError("CUDA out of memory"), True),
    (RuntimeError("MPS backend out of memory (MPS allocated: 17 GB)"), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory"),
     True),
    (MemoryError(), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
    (TypeError("out of memory"), False),
])
def test_out_of_memory_is_recognised_across_backends(error, expected):
    assert bench_devices.is_out_of_memory(error) is expected


# ---- timing: synchronize around every sample ---------------------------------------------------

class AsyncDevice:
    """A fake device: ops only queue work; synchronize runs it and advances a fake clock."""

    def __init__(self, seconds_per_op: float) -> None:
        self.now = 0.0
        self.queued = 0.0
        self.seconds_per_op = seconds_per_op

    def op(self) -> None:
        self.queued += self.seconds_per_op

    def synchronize(self) -> None:
        self.now += self.queued
        self.queued = 0.0


def test_time_op_counts_queued_work_by_synchronizing(monkeypatch):
    device = AsyncDevice(seconds_per_op=0.002)
    monkeypatch.setattr(bench_timing.time, "perf_counter", lambda: device.now)
    timing = bench_timing.time_op(device.op, device.synchronize, repeats=5, warmup=2,
                                  sample_seconds=0.02, budget_seconds=10)
    assert timing.median_s == pytest.approx(0.002)
    assert timing.samples == 5
    assert timing.inner == 10  # 0.02 s per sample / 0.002 s per op


def test_warmup_work_is_not_counted(monkeypatch):
    device = AsyncDevice(seconds_per_op=1.0)
    monkeypatch.setattr(bench_timing.time, "perf_counter", lambda: device.now)
    device.op()  # work queued before timing starts must not land in the first sample
    timing = bench_timing.time_op(device.op, device.synchronize, repeats=3, warmup=0,
                                  sample_seconds=0.02, budget_seconds=100)
    assert (timing.p25_s, timing.median_s, timing.p75_s) == (1.0, 1.0, 1.0)


class CountingDevice(AsyncDevice):
    def __init__(self, seconds_per_op: float) -> None:
        super().__init__(seconds_per_op)
        self.calls = 0

    def op(self) -> None:
        self.calls += 1
        super().op()


def test_slow_ops_take_few_samples_within_the_budget(monkeypatch):
    device = CountingDevice(seconds_per_op=4.0)
    monkeypatch.setattr(bench_timing.time, "perf_counter", lambda: device.now)
    timing = bench_timing.time_op(device.op, device.synchronize, repeats=7, warmup=3,
                                  sample_seconds=0.02, budget_seconds=3)
    assert (timing.inner, timing.samples) == (1, bench_timing.MIN_SAMPLES)
    assert timing.median_s == 4.0
    # One warm-up call (it already spent the budget), then the calibration run, which is kept
    # as the first of the three samples.
    assert device.calls == 1 + 3


# ---- report: speedup and crossover ------------------------------------------------------------

def point(device: str, size: int, seconds: float, workload: str = "matvec") -> Result:
    return Result(workload, "float32", device, size, OK, flops=2.0 * size * size,
                  timing=Timing(seconds, seconds, seconds, 3, 1))


def test_speedup_is_cpu_time_over_accelerator_time():
    cpu, mps = point("cpu", 64, 3.0), point("mps", 64, 1.5)
    assert speedups([cpu, mps]) == {id(mps): 2.0}


def test_crossover_is_where_the_accelerator_starts_winning_for_good():
    results = [point("cpu", 16, 1.0), point("mps", 16, 2.0),
               point("cpu", 32, 2.0), point("mps", 32, 1.0),   # a lucky win
               point("cpu", 64, 2.0), point("mps", 64, 3.0),
               point("cpu", 128, 8.0), point("mps", 128, 4.0),
               point("cpu", 256, 32.0), point("mps", 256, 4.0)]
    [found] = crossovers(results)
    assert (found.device, found.size) == ("mps", 128)
    assert "cpu faster below m=128" in found.summary and "8x at m=256" in found.summary


def test_crossover_when_one_side_always_wins():
    always_gpu = crossovers([point("cpu", 16, 2.0), point("cuda", 16, 1.0)])
    always_cpu = crossovers([point("cpu", 16, 1.0), point("cuda", 16, 2.0),
                             point("cpu", 32, 1.0), point("cuda", 32, 2.0)])
    assert always_gpu[0].size == 16 and "faster at every m" in always_gpu[0].summary
    assert always_cpu[0].size is None and "cpu faster at the largest m" in always_cpu[0].summary


def test_table_shows_speedup_and_status_without_widening_columns():
    environment = {"torch": "2.x", "devices": {"cpu": "x", "cuda": "y"}}
    measured = [point("cpu", 16, 2e-3), point("cuda", 16, 1e-3)]
    unfit = Result("matvec", "float32", "mps", 16, DOES_NOT_FIT, 1.0, note="out of memory")
    lines = format_table([*measured, unfit], environment).splitlines()
    assert lines[3].split()[-1] == "2x"
    assert lines[4].endswith("does not fit: out of memory")
    without_unfit = format_table(measured, environment).splitlines()
    assert lines[1:4] == without_unfit[1:4]


def test_unreliable_points_are_marked_in_the_table_and_the_plot():
    environment = {"torch": "2.x", "devices": {"cpu": "x", "cuda": "y"}}
    spread = Timing(1e-3, 0.5e-3, 2e-3, 5, 1)  # IQR 1.5 ms, above half the 1 ms median
    results = [Result("matvec", "float32", "cpu", 16, OK, 1.0, spread), point("cuda", 16, 1e-4),
               point("cpu", 32, 1e-3), point("cuda", 32, 1e-4)]
    lines = format_table(results, environment).splitlines()
    assert lines[2].endswith("unreliable: IQR above half the median")
    assert not any("unreliable" in line for line in lines[3:6])
    figure = bench_report.draw(results, environment)
    time_panel, speedup_panel = figure.axes[:2]
    for panel in (time_panel, speedup_panel):  # the cuda speedup at 16 rests on the shaky cpu time
        labels = [text.get_text() for text in panel.get_legend().get_texts()]
        assert "unreliable: IQR above half the median" in labels
        [ring] = [c for c in panel.collections if c.get_label().startswith("unreliable")]
        assert [x for x, _ in ring.get_offsets()] == [16]


# ---- devices and bad input -------------------------------------------------------------------

def test_devices_default_to_cpu_plus_every_accelerator(monkeypatch):
    monkeypatch.setattr(bench_devices, "accelerators_present", lambda: ["mps"])
    assert bench_devices.choose_devices(None, cpu_only=False) == ["cpu", "mps"]
    assert bench_devices.choose_devices(None, cpu_only=True) == ["cpu"]
    assert bench_devices.choose_devices(["mps", "cpu"], cpu_only=False) == ["cpu", "mps"]


def test_bf16_on_mps_before_macos_14_is_refused():
    ventura = MACHINES["m1_macos13_torch2.8"]
    with pytest.raises(MpslaunchError, match="bf16 on mps needs macOS 14"):
        bench_devices.check_dtype_supported("mps", "bfloat16", ventura)
    bench_devices.check_dtype_supported("mps", "float16", ventura)
    bench_devices.check_dtype_supported("cpu", "bfloat16", ventura)
    bench_devices.check_dtype_supported("mps", "bfloat16", MACHINES["m1_macos14"])


BAD_INPUT = [
    (["--sizes", "0,16"], "--sizes takes positive whole numbers"),
    (["--sizes", "1e3"], "--sizes takes positive whole numbers"),
    (["--sizes", ","], "--sizes is empty"),
    (["--batch-sizes", "-4"], "--batch-sizes takes positive whole numbers"),
    (["--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["--devices", "tpu"], "unknown device 'tpu'"),
    (["--workload", "resnet"], "unknown workload 'resnet'"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--budget", "1e308"], "--budget above 0 seconds, at most 86400"),
    (["--budget", "inf"], "--budget above 0 seconds, at most 86400"),
    (["--budget", "nan"], "--budget above 0 seconds, at most 86400"),
]


@pytest.mark.parametrize("argv, message", BAD_INPUT)
def test_bad_input_is_one_sentence(argv, message):
    with pytest.raises(MpslaunchError) as raised:
        bench.main(parse(argv))
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.skipif(bool(bench_devices.accelerators_present()), reason="needs a machine without one")
def test_asking_for_a_missing_accelerator_is_an_error_not_a_fallback():
    with pytest.raises(MpslaunchError, match="no usable cuda device"):
        bench.main(parse(["--devices", "cpu,cuda"]))


NO_ACCELERATOR = "mpslaunch: warning: this machine has no usable accelerator (mps or cuda)"


@pytest.mark.skipif(bool(bench_devices.accelerators_present()), reason="needs a machine without one")
def test_no_accelerator_is_said_before_measuring(monkeypatch, capsys):
    said_before_measuring = []

    def measure_nothing(options):
        said_before_measuring.append(capsys.readouterr().err)
        return [], False

    monkeypatch.setattr(bench, "run_all", measure_nothing)
    assert bench.main(parse(["--workload", "matvec", "--sizes", "16"])) == 0
    assert said_before_measuring[0].startswith(NO_ACCELERATOR)
    assert bench.main(parse(["--cpu", "--workload", "matvec", "--sizes", "16"])) == 0
    assert said_before_measuring[1] == ""  # --cpu asked for the cpu alone


@pytest.mark.slow
def test_cli_module_import_does_not_load_torch_or_config_only_packages():
    # cli.py imports bench to build its parser; the launcher must stay torch-free there, and
    # the GPU machine has no questionary/platformdirs.
    code = ("import sys, argparse, mpslaunch.commands.bench as b; b.add_arguments(argparse.ArgumentParser());"
            "print(sorted(m for m in ('torch', 'questionary', 'platformdirs') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- through the real CLI ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(bool(bench_devices.accelerators_present()), reason="needs a machine without one")
def test_cli_without_an_accelerator_warns_then_measures_the_cpu():
    done = run_cli("bench", "--workload", "matvec", "--sizes", "16", "--repeats", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0].startswith(NO_ACCELERATOR)
    assert {row["device"] for row in json.loads(done.stdout)["results"]} == {"cpu"}


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--sizes", "0"], ["--devices", "tpu"],
                                  ["--repeats", "x"], ["--budget", "1e308"]])
def test_cli_bad_input_exits_2_with_one_line(argv):
    done = run_cli("bench", *argv)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "error" in done.stderr


@pytest.mark.slow
def test_cli_cpu_run_prints_the_table_without_config_only_packages(tmp_path):
    # The GPU machine has no questionary or platformdirs: bench must never import them.
    done = run_cli("bench", "--cpu", "--sizes", "16", "--workload", "matvec", "--repeats", "2",
                   "--out", str(tmp_path), python_options=("-X", "importtime"))
    assert done.returncode == 0, done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "torch" in imported and "matplotlib" in imported  # the probe works
    assert not imported & {"questionary", "platformdirs"}
    assert "matvec    float32  m=16  cpu" in done.stdout
    assert "cpu only" in done.stdout
    assert (tmp_path / "bench.csv").is_file() and (tmp_path / "bench.png").is_file()


# Measures the first point for real; the second one blocks in torch (an op Python cannot
# interrupt, like one huge training step) after saying so in the file named by argv[1].
STUCK_IN_AN_OP = """
import sys, torch
import mpslaunch.bench.measure as measure
from mpslaunch.commands import main
real, calls = measure.measure, []
def stuck_on_the_second(*args):
    calls.append(args)
    if len(calls) == 1:
        return real(*args)
    open(sys.argv[1], "w").write("stuck\\n")
    torch.futures.Future().wait()
measure.measure = stuck_on_the_second
sys.exit(main(["bench", "--cpu", "--workload", "matvec", "--sizes", "16,32", "--repeats", "2"]))
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="sends SIGINT")
def test_ctrl_c_in_the_middle_of_a_long_op_stops_and_reports(tmp_path):
    import signal
    import time

    stuck = tmp_path / "stuck"
    bench_run = subprocess.Popen([sys.executable, "-c", STUCK_IN_AN_OP, str(stuck)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not stuck.exists():
            assert time.monotonic() < deadline and bench_run.poll() is None, bench_run.stderr.read()
            time.sleep(0.05)
        bench_run.send_signal(signal.SIGINT)
        out, err = bench_run.communicate(timeout=60)
    finally:
        bench_run.kill()  # a failing test must not leave it blocked
    assert bench_run.returncode == bench.EXIT_INTERRUPTED, err
    assert "m=16" in out and "m=32" not in out
    assert "bench interrupted" in err and "Traceback" not in err


# ---- --out refused before measuring ------------------------------------------------------------

@pytest.mark.slow
def test_an_out_that_is_a_file_is_refused_before_measuring(tmp_path):
    (tmp_path / "results.csv").write_text("kept\n")
    refused = run_cli("bench", *TINY, "--out", str(tmp_path / "results.csv"))
    line = one_line_error(refused)
    assert "--out" in line and "results.csv is not a folder" in line and refused.stdout == ""
    assert (tmp_path / "results.csv").read_text() == "kept\n"


@pytest.mark.slow
def test_an_out_in_a_read_only_place_is_refused_before_measuring(tmp_path):
    with read_only_disk(tmp_path / "ro") as place:
        for out in (place, place / "results"):
            refused = run_cli("bench", *TINY, "--out", str(out))
            line = one_line_error(refused)
            assert f"--out folder {out} (Read-only file system)" in line and refused.stdout == ""
