"""Do the examples keep the device busy? End-to-end images/s against the pure step rate.

For each example (examples/cv_example.py, examples/complete_cv_example.py), in one run, side by
side on the same device, model, batch size and precision:

  pure step   the example's own model, Normalize, optimizer and train_step, fed one uint8 batch
              that already lives on the device: the most this job can do here;
  end to end  the example's main() on JPEG files through `mpslaunch launch`, one process, as a
              user runs it: training images/s over all epochs, waiting for data included,
              eval excluded, counted from the end of the first step;
  data alone  the example run with its train_step replaced by nothing: the images/s its data
              pipeline delivers to the device (decoding, augmentation, batching, the copy);
  start-up    from the launch command to the end of the first step, the part of it the
              example's imports took, and the rest.

The examples carry no clocks: `mpslaunch launch` starts this file (--worker end_to_end), which
imports the example (timing that), wraps its train_epoch and train_step in clocks (the first
step waits for the device) and calls its main() with the options a user would give.

ratio = end to end / pure step; data/pure < 1 says the CPUs cannot decode as fast as the device
trains. Rows are printed as they are measured, then a table of all of them.

Scenarios (the images are made here; nothing is downloaded):
  demo    examples/make_demo_images.py's hand-written digits (64x64 JPEGs), trained at 64 px;
  photos  Pet-sized JPEGs, 500x375 or 375x500 at quality 90 (~120 KB, so decoding costs what the
          Oxford-IIIT Pet photos cost), coloured 1/f noise in 37 classes, trained at 224 px.

This CPU machine, from the repo root:

    .venv/bin/python benchmarks/cv_throughput.py --scenario demo --repeats 4 --wait_idle 600

A CUDA machine (torch, torchvision and accelerate installed; mpslaunch from src/):

    PYTHONPATH=src python3 benchmarks/cv_throughput.py --scenario photos --model resnet50 \\
        --mixed_precision bf16
    PYTHONPATH=src python3 benchmarks/cv_throughput.py --scenario photos --model resnet18

Exit code 0 when every run trained (the ratios are reported, not judged), 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
EXAMPLE_NAMES = ("cv_example", "complete_cv_example")
PET_CLASSES = 37


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", default=",".join(EXAMPLE_NAMES),
                        help="comma-separated (default: both)")
    parser.add_argument("--scenario", choices=("demo", "photos"), default="demo")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--image_size", type=int, default=None,
                        help="default: 64 for the demo digits, 224 for the photos")
    parser.add_argument("--mixed_precision", choices=("no", "fp16", "bf16"), default="no")
    parser.add_argument("--cpu", action="store_true", help="even when a GPU is there")
    parser.add_argument("--photos", type=int, default=None,
                        help="photo files to make (default 8000 on a GPU, 240 on the CPU)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs of each end-to-end run (default 3 on a GPU, 2 on the CPU)")
    parser.add_argument("--num_workers", type=int, default=None, help="default: the example's")
    parser.add_argument("--seconds", type=float, default=None,
                        help="timed seconds of each pure-step run (default 10 GPU, 8 CPU)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="end-to-end and pure-step runs in turn, the best kept (default 1 "
                             "on a GPU, 2 on the CPU: other work on a shared machine only slows)")
    parser.add_argument("--wait_idle", type=float, default=0, metavar="SECONDS",
                        help="on a shared machine: start each run once the CPUs were 90%% idle "
                             "for 3 s, waiting at most this long (default 0: at once)")
    parser.add_argument("--data_root", type=Path,
                        default=Path(tempfile.gettempdir()) / "cv_throughput_data",
                        help="where the generated images are kept between runs")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    # One measurement, in a process of its own (see pure_step_worker, data_worker).
    parser.add_argument("--worker", choices=("pure_step", "data", "end_to_end"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--example", help=argparse.SUPPRESS)
    parser.add_argument("--data_dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--output_dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--num_classes", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def import_example(name: str):
    """An example as a module; examples/ on sys.path, so that DataLoader workers started by
    spawn (macOS) find its classes too."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


# ---------------------------------------------------------------- the images


def colored_noise(seed: int, side: int = 640):
    """A (3, side, side) uint8 picture with a natural image's 1/f spectrum and related colours."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    fy = torch.fft.fftfreq(side)[:, None]
    fx = torch.fft.rfftfreq(side)[None, :]
    amplitude = 1.0 / torch.sqrt(fx**2 + fy**2).clamp_min(1.0 / side)
    phase = torch.rand(3, side, side // 2 + 1, generator=generator) * (2 * math.pi)
    fields = torch.fft.irfft2(amplitude * torch.exp(1j * phase), s=(side, side))
    fields = (fields - fields.mean(dim=(1, 2), keepdim=True)) / fields.std(dim=(1, 2), keepdim=True)
    mixing = torch.eye(3) * 0.6 + 0.4 * torch.rand(3, 3, generator=generator)  # correlated RGB
    picture = torch.einsum("ij,jhw->ihw", mixing, fields) * 45 + 128
    return picture.clamp(0, 255).to(torch.uint8)


def write_photo(task: tuple[Path, int]) -> None:
    """One Pet-sized JPEG: a crop of a noise field, 500x375 or (1 in 3) 375x500."""
    import torch
    from torchvision.io import encode_jpeg
    torch.set_num_threads(1)
    path, seed = task
    generator = torch.Generator().manual_seed(seed)
    base = colored_noise(seed % 97)  # 97 distinct fields, each cropped many ways
    height, width = (500, 375) if seed % 3 == 0 else (375, 500)
    top = int(torch.randint(0, base.shape[1] - height + 1, (1,), generator=generator))
    left = int(torch.randint(0, base.shape[2] - width + 1, (1,), generator=generator))
    crop = base[:, top:top + height, left:left + width].contiguous()
    path.write_bytes(encode_jpeg(crop, quality=90).numpy().tobytes())


def make_photos(folder: Path, count: int) -> Path:
    """Pet-named JPEGs (class_07_123.jpg), kept and reused once complete."""
    done = folder / ".complete"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tasks = [(folder / f"class_{n % PET_CLASSES:02d}_{n}.jpg", n) for n in range(count)]
        with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
            list(pool.map(write_photo, tasks, chunksize=32))
        done.touch()
    return folder


def make_demo(folder: Path) -> Path:
    done = folder / ".complete"
    if not done.exists():
        import_example("make_demo_images").write_demo_images(folder, size=64)
        done.touch()
    return folder


# ---------------------------------------------------------------- the measurements


class Clock:
    """Clocks around an example's train_epoch and train_step: the seconds its epochs train after
    the first step (which is waited for) and the images they train."""

    def __init__(self, example):
        owner = getattr(example, "Training", example)  # complete_cv_example's is a method
        real_epoch, real_step = owner.train_epoch, example.train_step
        self.first_step_done, self.first_step_at, self.images, self.seconds = None, None, 0, 0.0

        def train_epoch(*args, **kwargs):  # it ends once the device is done (it reads the loss)
            started = time.perf_counter()
            result = real_epoch(*args, **kwargs)
            self.seconds += time.perf_counter() - max(started, self.first_step_done or started)
            return result

        def train_step(accelerator, model, optimizer, scheduler, normalize, images, labels):
            loss = real_step(accelerator, model, optimizer, scheduler, normalize, images, labels)
            if self.first_step_done is None:  # start-up (kernels loaded, the first batch)
                loss.item()  # waits for the device
                self.first_step_done, self.first_step_at = time.perf_counter(), time.time()
            else:
                self.images += len(images) * accelerator.num_processes
            return loss

        owner.train_epoch, example.train_step = train_epoch, train_step

    def write(self, output_dir: Path, **more) -> None:
        if os.environ.get("RANK", "0") == "0":
            (output_dir / "clock.json").write_text(json.dumps({
                "train_images_per_second": self.images / self.seconds,
                "first_step_at": self.first_step_at, **more}))


def end_to_end_worker(args: argparse.Namespace) -> int:
    """Run by `mpslaunch launch`: the example's imports timed, then its main() with clocks."""
    started_at = time.time()
    example = import_example(args.example)
    imports_s = time.time() - started_at
    clock = Clock(example)
    code = example.main([*example_options(args, args.data_dir, args.image_size, args.epochs),
                         "--output_dir", str(args.output_dir)])
    if code == 0:
        clock.write(args.output_dir, imports_s=imports_s)
    return code


def pure_step_worker(args: argparse.Namespace) -> None:
    """The example's own step, as its training sets it up, on one batch already on the device."""
    import torch
    from accelerate import Accelerator
    example = import_example(args.example)
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)  # as they do
    normalize = example.Normalize(accelerator.device)
    model = example.build_model(args.model, args.num_classes, pretrained=False)
    model = model.to(memory_format=normalize.memory_format)
    optimizer, scheduler = example.make_optimizer(model, 3e-3, total_steps=10**7)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    shape = (args.batch_size, 3, args.image_size, args.image_size)
    images = torch.randint(0, 256, shape, dtype=torch.uint8, device=accelerator.device)
    labels = torch.randint(0, args.num_classes, (args.batch_size,), device=accelerator.device)

    def seconds_for(steps: int) -> float:
        started = time.perf_counter()
        for _ in range(steps):
            loss = example.train_step(accelerator, model, optimizer, scheduler, normalize,
                                      images, labels)
        loss.item()  # waits for the device
        return time.perf_counter() - started

    seconds_for(5)  # warm-up: kernels loaded, algorithms chosen, memory allocated
    steps = max(10, round(args.seconds / (seconds_for(5) / 5)))
    print(json.dumps({"pure_images_per_second": steps * args.batch_size / seconds_for(steps),
                      "device": accelerator.device.type,
                      "device_name": torch.cuda.get_device_name()
                      if accelerator.device.type == "cuda" else "cpu",
                      "mixed_precision": accelerator.mixed_precision, "torch": torch.__version__}))


def data_worker(args: argparse.Namespace) -> int:
    """The example itself, with a train_step that does nothing: the clock then gives the rate
    at which its data pipeline delivers batches to the device."""
    import torch
    example = import_example(args.example)
    example.train_step = lambda accelerator, *rest: torch.zeros((), device=accelerator.device)
    clock = Clock(example)
    code = example.main([*example_options(args, args.data_dir, args.image_size, epochs=2),
                         *(["--cpu"] if args.cpu else []), "--mixed_precision",
                         args.mixed_precision, "--output_dir", str(args.output_dir)])
    if code == 0:
        clock.write(args.output_dir)
    return code


def example_options(args: argparse.Namespace, data_dir: Path, image_size: int,
                    epochs: int) -> list[str]:
    options = ["--data_dir", str(data_dir), "--model", args.model,
               "--batch_size", str(args.batch_size), "--image_size", str(image_size),
               "--num_epochs", str(epochs)]
    return options + (["--num_workers", str(args.num_workers)] if args.num_workers is not None
                      else [])


def child_env(config_dir: str) -> dict:
    """mpslaunch from this checkout; a config folder of its own, so no user profile applies."""
    path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "MPSLAUNCH_CONFIG_DIR": config_dir}


def worker_options(args: argparse.Namespace, worker: str, example: str, data_dir: Path,
                   image_size: int, num_classes: int, output_dir: Path) -> list[str]:
    """This file's options for one measurement in a process of its own."""
    return ["--worker", worker, "--example", example, "--data_dir", str(data_dir),
            "--image_size", str(image_size), "--output_dir", str(output_dir),
            "--num_classes", str(num_classes), "--model", args.model,
            "--batch_size", str(args.batch_size), "--mixed_precision", args.mixed_precision,
            "--seconds", str(args.seconds), "--epochs", str(args.epochs)] \
        + (["--cpu"] if args.cpu else []) \
        + (["--num_workers", str(args.num_workers)] if args.num_workers is not None else [])


def run_worker(args: argparse.Namespace, worker: str, example: str, data_dir: Path,
               image_size: int, num_classes: int, output_dir: Path = Path(".")) -> str:
    command = [sys.executable, __file__, *worker_options(args, worker, example, data_dir,
                                                         image_size, num_classes, output_dir)]
    with tempfile.TemporaryDirectory() as config_dir:
        result = subprocess.run(command, capture_output=True, text=True,
                                env=child_env(config_dir))
    if result.returncode != 0:
        raise RuntimeError(f"{worker} run of {example} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def pure_step_rate(args, example: str, image_size: int, num_classes: int) -> dict:
    output = run_worker(args, "pure_step", example, Path("."), image_size, num_classes)
    return json.loads(output.strip().splitlines()[-1])


def data_rate(args, example: str, data_dir: Path, image_size: int) -> float:
    output = Path(tempfile.mkdtemp(prefix="cv_throughput_data_"))
    run_worker(args, "data", example, data_dir, image_size, num_classes=0, output_dir=output)
    return json.loads((output / "clock.json").read_text())["train_images_per_second"]


def end_to_end(args, example: str, data_dir: Path, image_size: int) -> dict:
    """One `mpslaunch launch` run, one process, of the example's main() as a user starts it
    (the precision and the device from the launcher's options, not the example's)."""
    output = Path(tempfile.mkdtemp(prefix="cv_throughput_run_"))
    command = [sys.executable, "-m", "mpslaunch", "launch", "--num_processes", "1",
               "--mixed_precision", args.mixed_precision, *(["--cpu"] if args.cpu else []),
               __file__, *worker_options(args, "end_to_end", example, data_dir, image_size,
                                         num_classes=0, output_dir=output)]
    with tempfile.TemporaryDirectory() as config_dir:
        launched_at = time.time()
        result = subprocess.run(command, capture_output=True, text=True,
                                env=child_env(config_dir))
    if result.returncode != 0:
        raise RuntimeError(f"{example} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    metrics = json.loads((output / "metrics.json").read_text())
    clock = json.loads((output / "clock.json").read_text())
    return {**metrics, "train_images_per_second": clock["train_images_per_second"],
            "launch_to_first_step_s": clock["first_step_at"] - launched_at,
            "imports_s": clock["imports_s"], "command": " ".join(command[1:])}


def wait_for_idle_cpus(limit_s: float) -> None:
    import psutil  # an Accelerate dependency
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and psutil.cpu_percent(interval=3) > 10:
        pass


def measure(args, example: str, data_dir: Path, image_size: int, num_classes: int,
            epochs: int) -> dict:
    runs, pures = [], []
    for repeat in range(args.repeats):
        print(f"[{example}] end to end {repeat + 1}/{args.repeats}: {epochs} epochs of "
              f"{data_dir} at {image_size} px ...", flush=True)
        wait_for_idle_cpus(args.wait_idle)
        runs.append(end_to_end(args, example, data_dir, image_size))
        print(f"[{example}] pure step {repeat + 1}/{args.repeats} ...", flush=True)
        wait_for_idle_cpus(args.wait_idle)
        pures.append(pure_step_rate(args, example, image_size, num_classes))
    print(f"[{example}] data pipeline alone ...", flush=True)
    wait_for_idle_cpus(args.wait_idle)
    data = data_rate(args, example, data_dir, image_size)
    e2e = max(runs, key=lambda run: run["train_images_per_second"])
    pure = max(pures, key=lambda run: run["pure_images_per_second"])
    return {
        "example": example, "scenario": args.scenario, "model": args.model,
        "device": e2e["device"], "device_name": pure["device_name"], "torch": pure["torch"],
        "mixed_precision": e2e["mixed_precision"], "image_size": image_size,
        "batch_size": args.batch_size, "epochs": epochs, "train_images": e2e["train_images"],
        "pure_images_per_second": pure["pure_images_per_second"],
        "end_to_end_images_per_second": e2e["train_images_per_second"],
        "ratio": e2e["train_images_per_second"] / pure["pure_images_per_second"],
        "data_images_per_second": data,
        "data_over_pure": data / pure["pure_images_per_second"],
        "launch_to_first_step_s": e2e["launch_to_first_step_s"], "imports_s": e2e["imports_s"],
        "after_imports_s": e2e["launch_to_first_step_s"] - e2e["imports_s"],
        "eval_accuracy": e2e["eval_accuracy"],
        "all_end_to_end": [run["train_images_per_second"] for run in runs],
        "all_pure": [run["pure_images_per_second"] for run in pures],
        "command": e2e["command"],
    }


def report(rows: list[dict]) -> str:
    lines = [f"{'example':20} {'scenario':8} {'model':9} {'dev':4} {'prec':4} {'px':>4} "
             f"{'pure img/s':>10} {'e2e img/s':>10} {'ratio':>5} {'data img/s':>10} "
             f"{'data/pure':>9} {'1st step':>8} {'imports':>7} {'rest':>6}"]
    for r in rows:
        lines.append(
            f"{r['example']:20} {r['scenario']:8} {r['model']:9} {r['device']:4} "
            f"{r['mixed_precision']:4} {r['image_size']:>4} {r['pure_images_per_second']:>10,.0f} "
            f"{r['end_to_end_images_per_second']:>10,.0f} {r['ratio']:>5.2f} "
            f"{r['data_images_per_second']:>10,.0f} {r['data_over_pure']:>9.2f} "
            f"{r['launch_to_first_step_s']:>7.1f}s {r['imports_s']:>6.1f}s "
            f"{r['after_imports_s']:>5.1f}s")
        if len(r["all_end_to_end"]) > 1:  # the table keeps the best; the spread matters too
            end_to_end, pure = (", ".join(f"{x:,.0f}" for x in r[key])
                                for key in ("all_end_to_end", "all_pure"))
            lines.append(f"  every run: end to end {end_to_end}; pure step {pure}")
    lines.append("ratio: end-to-end training images/s / pure step rate; data: the example's "
                 "data pipeline alone (its train_step replaced by nothing); 1st step: seconds "
                 "from the launch command to the end of the first step, of which imports: the "
                 "script's imports, rest: everything else (launcher, set-up, the first step).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker == "end_to_end":  # before torch is imported: it times the example's imports
        return end_to_end_worker(args)
    import torch
    gpu = not args.cpu and torch.cuda.is_available()
    args.cpu = not gpu
    args.seconds = args.seconds or (10.0 if gpu else 8.0)
    if args.worker == "pure_step":
        return pure_step_worker(args) or 0
    if args.worker == "data":
        return data_worker(args)
    args.repeats = args.repeats or (1 if gpu else 2)
    epochs = args.epochs = args.epochs or (3 if gpu else 2)
    if args.scenario == "photos":
        count = args.photos or (8000 if gpu else 240)
        data_dir, classes = make_photos(args.data_root / f"photos_{count}", count), PET_CLASSES
    else:
        data_dir, classes = make_demo(args.data_root / "demo"), 10
    image_size = args.image_size or (224 if args.scenario == "photos" else 64)
    rows = []
    for example in args.examples.split(","):
        rows.append(measure(args, example, data_dir, image_size, classes, epochs))
        print(report(rows[-1:]), flush=True)
    print(report(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
