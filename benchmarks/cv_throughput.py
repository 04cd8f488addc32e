"""Do the examples keep the device busy? End-to-end images/s against the pure step rate.

For each example file, in one run, side by side on the same device, model, batch size and
precision, the runs taking turns:

  end to end  the example through `mpslaunch launch`, one process, as a user runs it, on JPEG
              files: the training images/s it reports for its last epoch (waiting for data
              included, evaluation excluded; the first epoch also holds the start-up);
  pure step   a step of the same model, uint8-to-float normalisation and optimizer on one batch
              already on the device (the same for every example): the most this job can do;
  data alone  the example's own ImageFiles through a DataLoader with its default workers, no
              training: the images/s its decoding and augmentation deliver.

ratio = end to end / pure step; `vs first` compares each example's end to end with the first
file's, so an older version of an example can be measured beside the current one:

    git show main:examples/cv_example.py > /tmp/old/cv_example.py
    .venv/bin/python benchmarks/cv_throughput.py --examples /tmp/old/cv_example.py,examples/cv_example.py

Scenarios (the images are made here; nothing is downloaded): `demo`, make_demo_images.py's
hand-written digits (64x64 JPEGs) trained at 64 px; `photos`, Pet-sized JPEGs (500x375, quality
90, ~120 KB) of coloured 1/f noise in 37 classes, trained at 224 px. On a CUDA machine:

    PYTHONPATH=src python3 benchmarks/cv_throughput.py --scenario photos --model resnet50 \\
        --mixed_precision bf16

Exit code 0 when every run trained (the ratios are reported, not judged), 1 otherwise.
"""

import argparse
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
PET_CLASSES = 37
EPOCH_LINE = re.compile(r"epoch (\d+)/(\d+): loss [\d.]+, ([\d,]+) training images/s")


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The images, model and precision: the same options in cv_data_path.py."""
    parser.add_argument("--scenario", choices=("demo", "photos"), default="demo")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--image_size", type=int, help="default: 64 (demo), 224 (photos)")
    parser.add_argument("--mixed_precision", choices=("no", "fp16", "bf16"), default="no")
    parser.add_argument("--cpu", action="store_true", help="even when a GPU is there")
    parser.add_argument("--images", type=int, help="how many: default all 1,797 digits (demo); "
                        "8000 photos on a GPU, 240 on the CPU (photos)")
    parser.add_argument("--data_root", type=Path,
                        default=Path(tempfile.gettempdir()) / "cv_throughput_data")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", default="examples/cv_example.py,"
                        "examples/complete_cv_example.py", help="comma-separated example files")
    add_job_arguments(parser)
    parser.add_argument("--epochs", type=int, default=2, help="of each end-to-end run")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each, the best kept")
    parser.add_argument("--seconds", type=float, default=8.0, help="of each pure-step run")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--worker", choices=("pure_step", "data"), help=argparse.SUPPRESS)
    parser.add_argument("--example", help=argparse.SUPPRESS)
    parser.add_argument("--data_dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--num_classes", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def load(path: Path, name: str | None = None):
    """A file as a module, its folder on sys.path (as when Python runs it), under its own name
    in sys.modules (DataLoader workers unpickle its classes from there)."""
    name = name or path.stem
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- the images


def colored_noise(seed: int, side: int = 640):
    """A (3, side, side) uint8 picture with a natural image's 1/f spectrum and related colours."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    fy, fx = torch.fft.fftfreq(side)[:, None], torch.fft.rfftfreq(side)[None, :]
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


def make_images(args) -> tuple[Path, int]:
    """The scenario's folder (kept and reused once complete) and its number of classes."""
    if args.scenario == "demo":
        folder, classes = args.data_root / f"demo_{args.images or 'all'}", 10
        if not (folder / ".complete").exists():
            load(EXAMPLES / "make_demo_images.py", "make_demo_images").write_demo_images(
                folder, count=args.images, size=64)
    else:
        count = args.images or (240 if args.cpu else 8000)
        folder, classes = args.data_root / f"photos_{count}", PET_CLASSES
        if not (folder / ".complete").exists():
            folder.mkdir(parents=True, exist_ok=True)
            tasks = [(folder / f"class_{n % PET_CLASSES:02d}_{n}.jpg", n) for n in range(count)]
            with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
                list(pool.map(write_photo, tasks, chunksize=32))
    (folder / ".complete").touch()
    return folder, classes


# ---------------------------------------------------------------- the measurements


def pure_step_worker(args) -> None:
    """The examples' step on one uint8 batch already on the device."""
    import torch
    import torchvision
    from accelerate import Accelerator
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    device = accelerator.device
    model = torchvision.models.get_model(args.model, num_classes=args.num_classes)
    if device.type != "mps":
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3 / 25)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 3e-3, total_steps=10**7)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    shape = (args.batch_size, 3, args.image_size, args.image_size)
    images = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    labels = torch.randint(0, args.num_classes, (args.batch_size,), device=device)

    def seconds_for(steps: int) -> float:
        started = time.perf_counter()
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model((images.float() - 114.5) / 57.6), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        loss.item()  # waits for the device
        return time.perf_counter() - started

    seconds_for(5)  # warm-up: kernels loaded, algorithms chosen, memory allocated
    steps = max(10, round(args.seconds / (seconds_for(5) / 5)))
    print(json.dumps({"images_per_second": steps * args.batch_size / seconds_for(steps),
                      "device": device.type, "torch": torch.__version__}))


def data_worker(args) -> None:
    """The example's ImageFiles through a DataLoader as the example sets it up on this device."""
    import torch
    example = load(Path(args.example))
    _, train_set, _ = example.find_images(args.data_dir, 42)
    device = torch.device("cpu") if args.cpu or not torch.cuda.is_available() else torch.device("cuda")
    workers = 0 if device.type == "cpu" else max(1, os.cpu_count() - 1)
    loader = torch.utils.data.DataLoader(
        example.ImageFiles(train_set, args.image_size, train=True), batch_size=args.batch_size,
        shuffle=True, drop_last=True, num_workers=workers, persistent_workers=workers > 0,
        pin_memory=device.type == "cuda")
    for _ in loader:  # the first epoch starts the workers
        pass
    started, images = time.perf_counter(), 0
    for batch_images, _labels in loader:
        images += len(batch_images.to(device, non_blocking=True))
    print(json.dumps({"images_per_second": images / (time.perf_counter() - started)}))


def run_worker(args, worker: str, example: Path, data_dir: Path, image_size: int,
               classes: int) -> dict:
    command = [sys.executable, __file__, "--worker", worker, "--example", str(example),
               "--data_dir", str(data_dir), "--image_size", str(image_size), "--num_classes",
               str(classes), "--model", args.model, "--batch_size", str(args.batch_size),
               "--mixed_precision", args.mixed_precision, "--seconds", str(args.seconds),
               *(["--cpu"] if args.cpu else [])]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{worker} run of {example} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def end_to_end(args, example: Path, data_dir: Path, image_size: int) -> tuple[float, dict]:
    """One `mpslaunch launch` run of the example: its last epoch's images/s and metrics."""
    with tempfile.TemporaryDirectory() as output, tempfile.TemporaryDirectory() as config:
        command = [sys.executable, "-m", "mpslaunch", "launch", "--num_processes", "1",
                   "--mixed_precision", args.mixed_precision, *(["--cpu"] if args.cpu else []),
                   str(example), "--data_dir", str(data_dir), "--model", args.model,
                   "--batch_size", str(args.batch_size), "--image_size", str(image_size),
                   "--num_epochs", str(args.epochs), "--output_dir", output]
        path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
        result = subprocess.run(command, capture_output=True, text=True, env={
            **os.environ, "PYTHONPATH": path, "MPSLAUNCH_CONFIG_DIR": config})
        if result.returncode != 0:
            raise RuntimeError(f"{example} failed ({result.returncode}):\n{result.stderr[-3000:]}")
        epochs = EPOCH_LINE.findall(result.stdout)
        metrics = json.loads((Path(output) / "metrics.json").read_text())
    return float(epochs[-1][2].replace(",", "")), metrics


def measure(args, examples: list[Path], data_dir: Path, image_size: int, classes: int) -> list:
    runs = {example: [] for example in examples}
    pures = []
    for repeat in range(args.repeats):  # the examples take turns, so that load hits all alike
        for example in examples:
            print(f"[{example}] end to end {repeat + 1}/{args.repeats} ...", flush=True)
            runs[example].append(end_to_end(args, example, data_dir, image_size))
        print(f"pure step {repeat + 1}/{args.repeats} ...", flush=True)
        pures.append(run_worker(args, "pure_step", examples[0], data_dir, image_size, classes))
    pure = max(run["images_per_second"] for run in pures)
    rows = []
    for example in examples:
        print(f"[{example}] data alone ...", flush=True)
        data = run_worker(args, "data", example, data_dir, image_size, classes)
        best, metrics = max(runs[example], key=lambda run: run[0])
        rows.append({"example": str(example), "scenario": args.scenario, "model": args.model,
                     "device": pures[0]["device"], "torch": pures[0]["torch"],
                     "image_size": image_size, "batch_size": args.batch_size,
                     "pure_images_per_second": pure, "end_to_end_images_per_second": best,
                     "all_end_to_end": [run[0] for run in runs[example]],
                     "all_pure": [run["images_per_second"] for run in pures],
                     "ratio": best / pure, "data_images_per_second": data["images_per_second"],
                     "eval_accuracy": metrics["eval_accuracy"]})
    for row in rows:
        row["vs_first"] = row["end_to_end_images_per_second"] / rows[0]["end_to_end_images_per_second"]
    return rows


def report(rows: list[dict]) -> str:
    lines = [f"{'example':42} {'dev':4} {'px':>4} {'pure img/s':>10} {'e2e img/s':>10} "
             f"{'ratio':>5} {'vs first':>8} {'data img/s':>10} {'accuracy':>8}"]
    for r in rows:
        lines.append(f"{r['example'][-42:]:42} {r['device']:4} {r['image_size']:>4} "
                     f"{r['pure_images_per_second']:>10,.0f} "
                     f"{r['end_to_end_images_per_second']:>10,.0f} {r['ratio']:>5.2f} "
                     f"{r['vs_first']:>8.2f} {r['data_images_per_second']:>10,.0f} "
                     f"{r['eval_accuracy']:>8.4f}")
        lines.append("  every end-to-end run: " + ", ".join(
            f"{x:,.0f}" for x in r["all_end_to_end"]) + "; pure step: " + ", ".join(
            f"{x:,.0f}" for x in r["all_pure"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker == "pure_step":
        return pure_step_worker(args) or 0
    if args.worker == "data":
        return data_worker(args) or 0
    import torch
    args.cpu = args.cpu or not torch.cuda.is_available()
    data_dir, classes = make_images(args)
    image_size = args.image_size or (224 if args.scenario == "photos" else 64)
    examples = [Path(name).resolve() for name in args.examples.split(",")]
    try:
        rows = measure(args, examples, data_dir, image_size, classes)
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return 1
    print(report(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
