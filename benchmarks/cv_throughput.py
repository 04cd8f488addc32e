"""Does cv_example's data pipeline keep the device busy? End-to-end images/s over the pure step rate.

For each scenario, in one run, side by side:

  (a) pure step rate: the same model, batch size, precision, memory format, normalisation and
      optimizer step as cv_example (its own train_step, through the same Accelerator setup), fed
      one random uint8 batch that already lives on the device: the ceiling for this job;
  (b) end to end: `mpslaunch launch examples/cv_example.py ...` on JPEG files on disk, as a user
      runs it; its metrics.json gives training images/s (all epochs, waiting for data included,
      eval excluded, from the end of the first step; +step1 counts that step too) and the rate
      of each epoch; time to the first step is measured from just before the launch command
      starts to the end of the first optimizer step: the start-up, with its own target.

  (c) the data pipeline alone: cv_example's own prepared training loader (workers, decoding,
      augmentation, pinning, copy to the device), iterated without training: how fast the data
      could come if the training loop took no time.

  ratio = (b) / (a); the issue's target is >= 0.85 and a first step within 5 s of the launch.
  (c) / (a) < 1 says the pipeline cannot feed this model on this machine's CPUs at all; (c) well
  above (a) with (b) still low says the loop and the pipeline compete for the main process.
  metrics.json's startup_s (printed below the table) says where the time to the first step went.

Scenarios (the files are made here, no network):
  photos  Pet-sized JPEGs: 500x375 (some 375x500), quality 90, about 120 KB each, so decoding
          costs what the Oxford-IIIT Pet photos cost; content is coloured 1/f noise (natural
          images' spectrum), 37 classes. Trained at --image_size 224 (default). Throughput only:
          what it learns means nothing.
  demo    the README's demo set: scikit-learn's hand-written digits as 64x64 JPEGs
          (examples/make_demo_images.py; needs scikit-learn, or --demo_dir with those files),
          trained at 64 px. An epoch is only ~22 steps, so on a GPU it runs 40 epochs and
          start-up weighs on the overall rate: read the last epoch's rate as well.

On the GPU machine, from the repo root:

    PYTHONPATH=src python3 benchmarks/cv_throughput.py --json /tmp/cv.json
    PYTHONPATH=src python3 benchmarks/cv_throughput.py --model resnet50 --mixed_precision bf16
    PYTHONPATH=src python3 benchmarks/cv_throughput.py --scenario photos --decode gpu,cpu

--decode (cv_example's option; default auto) takes a comma-separated list: each is run end to
end and as a pipeline alone, against the same pure step rate, one row each.

On this CPU machine (small defaults so it ends in a few minutes):

    .venv/bin/python benchmarks/cv_throughput.py

Exit code 0 when every run trained (the ratio is reported, not judged); 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
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
PET_CLASSES = 37


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its classes must unpickle (the batches DataLoader workers send)
    spec.loader.exec_module(module)
    return module


def import_cv_classifier() -> None:
    """examples/ on sys.path, for the package cv_example.py is made of (examples/cv_classifier)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=("photos", "demo", "both"), default="both")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--image_size", type=int, default=224, help="photos scenario")
    parser.add_argument("--mixed_precision", choices=("no", "fp16", "bf16"), default="no")
    parser.add_argument("--cpu", action="store_true", help="even when a GPU is there")
    parser.add_argument("--photos", type=int, default=None,
                        help="how many photo files (default 8000 on a GPU, 240 on the CPU)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs of each end-to-end run (default 3 on a GPU, 2 on the CPU; "
                             "on a GPU the demo scenario runs 40: an epoch of it is ~22 steps)")
    parser.add_argument("--num_workers", type=int, default=None, help="default: cv_example's")
    parser.add_argument("--decode", default="auto",
                        help="cv_example's --decode (auto, cpu, gpu); a comma-separated list "
                             "runs each")
    parser.add_argument("--launcher", choices=("mpslaunch", "python"), default="mpslaunch",
                        help="run cv_example through `mpslaunch launch` or plain python")
    parser.add_argument("--data_root", type=Path,
                        default=Path(tempfile.gettempdir()) / "cv_throughput_data",
                        help="where the generated images are kept between runs")
    parser.add_argument("--demo_dir", type=Path, default=None,
                        help="existing demo images (when scikit-learn is not installed here)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="measure each side this many times, keep the best "
                             "(default 1 on a GPU, 2 on the CPU)")
    parser.add_argument("--no_cuda_graph", action="store_true",
                        help="cv_example's --no_cuda_graph, for both sides")
    parser.add_argument("--image_cache_gb", default=None,
                        help="cv_example's --image_cache_gb (default: its own)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--pure_step_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--num_classes", type=int, default=PET_CLASSES, help=argparse.SUPPRESS)
    parser.add_argument("--loader_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loader_data_dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--loader_epochs", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=None,
                        help="timed seconds of the pure step (default 10 on a GPU, 8 on the CPU)")
    return parser.parse_args(argv)


def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


# ---------------------------------------------------------------- data


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


def write_photo(task: tuple[Path, int, int]) -> None:
    """One Pet-sized JPEG: a random crop of a noise field, 500x375 or (1 in 3) 375x500."""
    import torch
    from torchvision.io import encode_jpeg
    torch.set_num_threads(1)
    path, seed, label = task
    generator = torch.Generator().manual_seed(seed)
    base = colored_noise(seed % 97)  # 97 distinct fields, each cropped many ways
    height, width = (500, 375) if seed % 3 == 0 else (375, 500)
    top = int(torch.randint(0, base.shape[1] - height + 1, (1,), generator=generator))
    left = int(torch.randint(0, base.shape[2] - width + 1, (1,), generator=generator))
    crop = base[:, top:top + height, left:left + width].contiguous()
    path.write_bytes(encode_jpeg(crop, quality=90).numpy().tobytes())


def make_photos(folder: Path, count: int) -> Path:
    """Pet-named JPEGs (class_07_123.jpg); kept and reused when already complete."""
    done = folder / ".complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tasks = [(folder / f"class_{n % PET_CLASSES:02d}_{n}.jpg", n, n % PET_CLASSES)
             for n in range(count)]
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        list(pool.map(write_photo, tasks, chunksize=32))
    done.touch()
    return folder


def make_demo(folder: Path) -> Path:
    done = folder / ".complete"
    if not done.exists():
        load_example("make_demo_images").write_demo_images(folder, size=64)
        done.touch()
    return folder


# ---------------------------------------------------------------- (a) pure step rate


def pure_step_worker(args: argparse.Namespace) -> int:
    """Runs in its own process: cv_example's train_step on one batch already on the device."""
    import torch

    import_cv_classifier()
    from cv_classifier.model import (Normalizer, build_model, make_optimizer, make_train_step,
                                     memory_format_for)
    from cv_classifier.trainer import make_accelerator

    # cv_example's own set-up (with bf16 that matters: its autocast keeps no weight cache,
    # which a CUDA graph could not hold).
    accelerator = make_accelerator(args)
    device = accelerator.device
    memory_format = memory_format_for(device)
    model = build_model(args.model, args.num_classes, pretrained=False)
    model = model.to(memory_format=memory_format)
    optimizer, scheduler = make_optimizer(model, peak_lr=3e-3, total_steps=10**7,
                                          device=device)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    normalize = Normalizer(device, memory_format)
    size, batch = args.image_size, args.batch_size
    images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, device=device)
    labels = torch.randint(0, args.num_classes, (batch,), device=device)

    train_step = make_train_step(accelerator, model, optimizer, scheduler, normalize,
                                 cuda_graph=not args.no_cuda_graph)

    def steps(count: int) -> float:
        started = time.perf_counter()
        for _ in range(count):
            loss = train_step(images, labels)
        loss.item()  # waits for the device
        return time.perf_counter() - started

    steps(5)  # warm-up: cuDNN autotuning, allocator, lazy initialisation
    per_step = steps(5) / 5
    count = max(10, round(args.seconds / per_step))
    seconds = steps(count)
    print(json.dumps({"pure_images_per_second": count * batch / seconds, "pure_steps": count,
                      "pure_seconds": seconds, "device": device.type,
                      "device_name": torch.cuda.get_device_name(device)
                      if device.type == "cuda" else "cpu",
                      "mixed_precision": accelerator.mixed_precision,
                      "memory_format": str(memory_format).replace("torch.", ""),
                      "cuda_graph": getattr(train_step, "graph", None) is not None,
                      "torch": torch.__version__}))
    return 0


def pure_step_rate(args: argparse.Namespace, image_size: int, num_classes: int) -> dict:
    command = [sys.executable, __file__, "--pure_step_worker", "--model", args.model,
               "--batch_size", str(args.batch_size), "--image_size", str(image_size),
               "--mixed_precision", args.mixed_precision, "--num_classes", str(num_classes),
               "--seconds", str(args.seconds)] + (["--cpu"] if args.cpu else []) \
        + (["--no_cuda_graph"] if args.no_cuda_graph else [])
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pure step run failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- (c) the data pipeline alone


def loader_worker(args: argparse.Namespace) -> int:
    """Runs in its own process: cv_example's training loader, built by its own Trainer."""
    import torch

    cv = load_example("cv_example")  # its parse_args; the rest is in its package
    import_cv_classifier()
    from cv_classifier.images import find_images
    from cv_classifier.trainer import Trainer, make_accelerator

    cv_args = cv.parse_args(example_args(args, args.loader_data_dir, args.image_size, 1)
                            + (["--cpu"] if args.cpu else [])
                            + ["--mixed_precision", args.mixed_precision])
    samples, skipped = find_images(cv_args.data_dir)
    trainer = Trainer(cv_args, make_accelerator(cv_args), samples, skipped)
    rates = []
    for epoch in range(args.loader_epochs):
        trainer.sampler.set_epoch(epoch)
        trainer.train_loader.set_epoch(epoch)
        started, images = time.perf_counter(), 0
        # as the training loop gets them: with --decode gpu, decoded on the device
        for batch_images, _labels, _indices in trainer.training_batches(trainer.train_loader):
            images += batch_images.shape[0]
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        rates.append(images / (time.perf_counter() - started))
    print(json.dumps({"loader_images_per_second_per_epoch": rates, "decode": trainer.decode}))
    return 0


def loader_rate(args: argparse.Namespace, data_dir: Path, image_size: int) -> dict:
    command = [sys.executable, __file__, "--loader_worker", "--loader_data_dir", str(data_dir),
               "--model", args.model, "--batch_size", str(args.batch_size),
               "--image_size", str(image_size), "--mixed_precision", args.mixed_precision,
               "--loader_epochs", "2", "--decode", args.decode] + (["--cpu"] if args.cpu else [])
    if args.num_workers is not None:
        command += ["--num_workers", str(args.num_workers)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"loader run failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- (b) end to end


def example_args(args: argparse.Namespace, data_dir: Path, image_size: int,
                 epochs: int) -> list[str]:
    """cv_example's options for this benchmark, the same in (b) and (c)."""
    options = ["--data_dir", str(data_dir), "--model", args.model,
               "--batch_size", str(args.batch_size), "--image_size", str(image_size),
               "--num_epochs", str(epochs), "--decode", args.decode]
    if args.num_workers is not None:
        options += ["--num_workers", str(args.num_workers)]
    if args.image_cache_gb is not None:
        options += ["--image_cache_gb", str(args.image_cache_gb)]
    if args.no_cuda_graph:
        options += ["--no_cuda_graph"]
    return options


def end_to_end(args: argparse.Namespace, data_dir: Path, image_size: int, epochs: int) -> dict:
    output = Path(tempfile.mkdtemp(prefix="cv_throughput_run_"))
    script = [str(EXAMPLES / "cv_example.py"), *example_args(args, data_dir, image_size, epochs),
              "--output_dir", str(output)]
    env = dict(os.environ)
    if args.launcher == "mpslaunch":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"),
                                                          env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "mpslaunch", "launch", "--quiet",
                   "--mixed_precision", args.mixed_precision,
                   *(["--cpu"] if args.cpu else []), *script]
    else:
        command = [sys.executable, *script, "--mixed_precision", args.mixed_precision,
                   *(["--cpu"] if args.cpu else [])]
    launched_at = time.time()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.time() - launched_at
    if result.returncode != 0:
        raise RuntimeError(f"cv_example failed ({result.returncode}):\n{result.stderr[-3000:]}")
    metrics = json.loads((output / "metrics.json").read_text())
    metrics["seconds_from_launch_to_first_step"] = metrics["first_step_finished_at"] - launched_at
    metrics["wall_seconds"] = wall
    metrics["command"] = " ".join(command)
    return metrics


# ---------------------------------------------------------------- the driver


def run_scenario(args, name: str, data_dir: Path, image_size: int, num_classes: int,
                 epochs: int) -> dict:
    """Best of --repeats for each side, the two measured in turn (on a shared machine the
    best run is the one other work disturbed least)."""
    e2e_runs, pure_runs = [], []
    for repeat in range(args.repeats):
        print(f"[{name}] end to end ({repeat + 1}/{args.repeats}, --decode {args.decode}): "
              f"{epochs} epochs of {data_dir} at {image_size} px ...", flush=True)
        e2e_runs.append(end_to_end(args, data_dir, image_size, epochs))
        if args.pure is None:
            print(f"[{name}] pure step rate ({repeat + 1}/{args.repeats}) ...", flush=True)
            pure_runs.append(pure_step_rate(args, image_size, num_classes))
    e2e = max(e2e_runs, key=lambda run: run["train_images_per_second"])
    pure = args.pure or max(pure_runs, key=lambda run: run["pure_images_per_second"])
    last_epoch = e2e["train_images_per_second_per_epoch"][-1]
    print(f"[{name}] data pipeline alone (--decode {args.decode}) ...", flush=True)
    loader_run = loader_rate(args, data_dir, image_size)
    loader = loader_run["loader_images_per_second_per_epoch"][-1]
    return {
        "decode": e2e.get("decode", "cpu"), "decode_option": args.decode,
        "pure": pure,
        "loader_images_per_second": loader,
        "loader_images_per_second_per_epoch": loader_run["loader_images_per_second_per_epoch"],
        "loader_over_pure": loader / pure["pure_images_per_second"],
        "startup_s": e2e.get("startup_s", {}),
        "repeats": args.repeats,
        "all_end_to_end_images_per_second": [r["train_images_per_second"] for r in e2e_runs],
        "all_pure_images_per_second": [r["pure_images_per_second"] for r in pure_runs]
        or [pure["pure_images_per_second"]],
        "scenario": name, "model": args.model, "batch_size": args.batch_size,
        "image_size": image_size, "mixed_precision": e2e["mixed_precision"],
        "device": e2e["device"], "device_name": pure["device_name"],
        "memory_format": pure["memory_format"], "torch": pure["torch"],
        "pure_images_per_second": pure["pure_images_per_second"],
        "end_to_end_images_per_second": e2e["train_images_per_second"],
        "end_to_end_last_epoch_images_per_second": last_epoch,
        "ratio": e2e["train_images_per_second"] / pure["pure_images_per_second"],
        "ratio_last_epoch": last_epoch / pure["pure_images_per_second"],
        "ratio_with_first_step": e2e["train_images_per_second_with_first_step"]
        / pure["pure_images_per_second"],
        "ratio_first_epoch": e2e["train_images_per_second_per_epoch"][0]
        / pure["pure_images_per_second"],
        "cached_images": e2e.get("cached_images", 0),
        "cuda_graph": e2e.get("cuda_graph", False),
        "pure_cuda_graph": pure.get("cuda_graph", False),
        "data_wait_s_per_epoch": e2e.get("data_wait_s_per_epoch", []),
        "end_to_end_images_per_second_per_epoch": e2e["train_images_per_second_per_epoch"],
        "seconds_from_launch_to_first_step": e2e["seconds_from_launch_to_first_step"],
        "time_to_first_step_s_in_process": e2e["time_to_first_step_s"],
        "end_to_end_wall_seconds": e2e["wall_seconds"],
        "train_images": e2e["train_images"], "epochs": e2e["epochs"],
        "eval_accuracy": e2e["eval_accuracy"], "command": e2e["command"],
    }


def report_text(rows: list[dict]) -> str:
    lines = [f"{'scenario':8} {'model':10} {'dev':5} {'decode':6} {'prec':4} {'px':>4} "
             f"{'batch':>5} {'pure img/s':>11} {'e2e img/s':>10} {'ratio':>6} {'+step1':>7} "
             f"{'1st ep':>7} "
             f"{'last ep':>8} "
             f"{'data img/s':>11} {'1st step':>9} {'wall':>7}"]
    for r in rows:
        lines.append(
            f"{r['scenario']:8} {r['model']:10} {r['device']:5} {r['decode']:6} "
            f"{r['mixed_precision']:4} "
            f"{r['image_size']:>4} {r['batch_size']:>5} {r['pure_images_per_second']:>11,.0f} "
            f"{r['end_to_end_images_per_second']:>10,.0f} {r['ratio']:>6.2f} "
            f"{r['ratio_with_first_step']:>7.2f} {r['ratio_first_epoch']:>7.2f} "
            f"{r['ratio_last_epoch']:>8.2f} {r['loader_images_per_second']:>11,.0f} "
            f"{r['seconds_from_launch_to_first_step']:>8.1f}s {r['end_to_end_wall_seconds']:>6.1f}s")
    lines.append("ratio: end-to-end training images/s (all epochs, from the end of the first "
                 "step) / pure step rate; +step1: the same with the first step counted; "
                 "1st ep, last ep: the first and the last epoch alone; data img/s: the training loader "
                 "alone, no training; 1st step: seconds from the launch command to the end of "
                 "the first optimizer step.")
    for r in rows:
        phases = ", ".join(f"{phase} {at:.1f}s" for phase, at in r["startup_s"].items())
        graph = "the step replayed as a CUDA graph" if r["cuda_graph"] else "eager steps"
        lines.append(f"{r['scenario']} ({graph}; decode {r['decode']}, {r['cached_images']} images "
                     f"cached on the device) start-up, seconds after the process started: {phases}")
        epochs = ", ".join(f"{rate:,.0f} img/s, waited {wait:.1f}s" for rate, wait in
                           zip(r["end_to_end_images_per_second_per_epoch"],
                               r["data_wait_s_per_epoch"]))
        alone = ", ".join(f"{rate:,.0f}" for rate in r["loader_images_per_second_per_epoch"])
        lines.append(f"{r['scenario']} (decode {r['decode']}) data pipeline alone, img/s per "
                     f"epoch: {alone}")
        if epochs:
            lines.append(f"{r['scenario']} (decode {r['decode']}) per epoch, end to end, with the "
                         f"time the training loop stood waiting for its next batch: {epochs}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpu = not args.cpu and cuda_available()
    args.cpu = not gpu
    if args.seconds is None:
        args.seconds = 10.0 if gpu else 8.0
    if args.repeats is None:
        args.repeats = 1 if gpu else 2
    if args.pure_step_worker:
        return pure_step_worker(args)
    if args.loader_worker:
        return loader_worker(args)
    epochs = args.epochs or (3 if gpu else 2)
    rows = []
    decodes = args.decode.split(",")

    def each_decode(*scenario) -> None:
        """One row per --decode choice; the pure step rate is measured once."""
        args.pure = None
        for decode in decodes:
            args.decode = decode
            rows.append(run_scenario(args, *scenario))
            print(report_text(rows[-1:]), flush=True)  # each row as soon as it is measured
            args.pure = rows[-1].pop("pure")
        args.decode = ",".join(decodes)

    if args.scenario in ("photos", "both"):
        count = args.photos or (8000 if gpu else 240)
        photos = make_photos(args.data_root / f"photos_{count}", count)
        each_decode("photos", photos, args.image_size, PET_CLASSES, epochs)
    if args.scenario in ("demo", "both"):
        demo_dir = args.demo_dir
        if demo_dir is None and importlib.util.find_spec("sklearn") is None:
            print("[demo] skipped: scikit-learn is not installed here (or pass --demo_dir)")
        elif demo_dir is None:
            demo_dir = make_demo(args.data_root / "demo")
        if demo_dir is not None:
            demo_epochs = args.epochs or (40 if gpu else 2)
            each_decode("demo", demo_dir, 64, 10, demo_epochs)
    print(report_text(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
