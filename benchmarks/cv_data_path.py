"""Where the examples' end-to-end rate goes: decoding per core, the loader's settings, and each
epoch's wait for its first batch.

In one process, on the device Accelerate picks, with cv_throughput.py's images (`--scenario`) and
the examples' step (model, uint8-to-float normalisation, AdamW on a one-cycle schedule):

  per core    an example's ImageFiles read one image after another on one thread, the examples
              taking turns: the images/s one DataLoader worker can deliver (decode, crop, flip);
  pure step   the step on one uint8 batch already on the device, before and after the variants;
  variants    the example's ImageFiles through a DataLoader prepared by Accelerate, as the example
              builds it or with one setting changed (workers, pinned memory, non-blocking copies,
              prefetch, workers that stop after each epoch, normalising in the workers), trained
              for `--epochs` epochs: images/s counted as the example counts them (from the loop's
              start to the loss read back), the wait for the first batch, and images/s from the
              first batch on, each the mean over the epochs after the first (which also starts
              the workers); the rates also over the pure step.

    PYTHONPATH=src python3 benchmarks/cv_data_path.py --scenario photos --model resnet50 \\
        --mixed_precision bf16 --old /tmp/old/cv_example.py

Exit code 0 when every variant trained.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cv_throughput  # noqa: E402  the images, and loading an example as a module

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", type=Path, default=REPO / "examples" / "cv_example.py")
    parser.add_argument("--old", type=Path, help="another version of the example, measured as it "
                        "builds its loader, beside the current one")
    cv_throughput.add_job_arguments(parser)
    parser.add_argument("--epochs", type=int, default=3, help="of each variant")
    parser.add_argument("--per_core_images", type=int, default=300, help="of each round")
    parser.add_argument("--rounds", type=int, default=5, help="of the per-core turns")
    parser.add_argument("--per_core_only", action="store_true", help="no training")
    parser.add_argument("--only", help="comma-separated variant names (default: all)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


def variants(args, cpus: int) -> dict[str, dict]:
    """Each variant: the example's loader with one setting changed."""
    gpu = not args.cpu
    workers = max(1, cpus - 1) if gpu else 0  # the examples' default: all CPUs but one
    base = {"example": "new", "workers": workers, "pin_memory": gpu, "non_blocking": gpu,
            "prefetch_factor": 2, "persistent": True, "normalize_in_workers": False}
    table = {"as built": {}, "blocking copies": {"non_blocking": False},
             "not pinned": {"pin_memory": False, "non_blocking": False},
             "prefetch 4": {"prefetch_factor": 4}, "workers stop each epoch": {"persistent": False},
             "normalised in the workers": {"normalize_in_workers": True}}
    for fewer in sorted({max(1, cpus * 3 // 4 - 1), max(1, cpus // 2 - 1)} - {workers}, reverse=True):
        table[f"{fewer} workers"] = {"workers": fewer}
    if not gpu:
        table = {"as built": {}, "normalised in the workers": {"normalize_in_workers": True},
                 "1 worker": {"workers": 1}}
    if args.old:  # copied without waiting for the device: not in the old example
        table = {"old example": {"example": "old", "non_blocking": False}, **table}
    chosen = args.only.split(",") if args.only else list(table)
    return {name: {**base, **table[name]} for name in chosen}


class NormalizedInWorkers:
    """An ImageFiles whose images leave the worker as normalised float32 (4x the bytes)."""

    def __init__(self, images):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index):
        image, label = self.images[index]
        return (image.float() - 114.5) / 57.6, label


def per_core(examples: dict, train_set, args, rounds: int = 5) -> dict[str, float]:
    """Each example's images/s on one thread, the examples taking turns for `rounds` rounds (so
    that a busy machine slows all alike); the median round of each."""
    import torch
    torch.set_num_threads(1)
    images = {name: example.ImageFiles(train_set, args.image_size, train=True)
              for name, example in examples.items()}
    count = min(len(train_set), args.per_core_images)
    rates = {name: [] for name in images}
    for _ in range(rounds):
        for name, dataset in images.items():
            started = time.perf_counter()
            for index in range(count):
                dataset[index]
            rates[name].append(count / (time.perf_counter() - started))
    torch.set_num_threads(os.cpu_count())
    return {name: sorted(values)[len(values) // 2] for name, values in rates.items()}


class Trainer:
    """The examples' model, optimizer, schedule and step, prepared once."""

    def __init__(self, args, classes: int):
        import torch
        import torchvision
        from accelerate import Accelerator
        self.torch, self.args = torch, args
        self.accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
        self.device = self.accelerator.device
        model = torchvision.models.get_model(args.model, num_classes=classes)
        if self.device.type != "mps":
            model = model.to(memory_format=torch.channels_last)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3 / 25)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 3e-3, total_steps=10**7)
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(
            model, optimizer, scheduler)

    def step(self, images, labels, normalized: bool):
        torch = self.torch
        inputs = images if normalized else (images.float() - 114.5) / 57.6
        loss = torch.nn.functional.cross_entropy(self.model(inputs), labels, reduction="sum",
                                                 ignore_index=-100)
        loss = loss / (labels != -100).sum().clamp_min(1)
        self.accelerator.backward(loss)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def pure(self, classes: int, seconds: float = 6.0) -> float:
        torch, args = self.torch, self.args
        shape = (args.batch_size, 3, args.image_size, args.image_size)
        images = torch.randint(0, 256, shape, dtype=torch.uint8, device=self.device)
        labels = torch.randint(0, classes, (args.batch_size,), device=self.device)

        def seconds_for(steps: int) -> float:
            started = time.perf_counter()
            for _ in range(steps):
                loss = self.step(images, labels, normalized=False)
            loss.item()
            return time.perf_counter() - started

        seconds_for(5)
        steps = max(10, round(seconds / (seconds_for(5) / 5)))
        return steps * args.batch_size / seconds_for(steps)

    def variant(self, example, train_set, setting: dict) -> dict:
        from accelerate.data_loader import prepare_data_loader
        torch, args = self.torch, self.args
        images = example.ImageFiles(train_set, args.image_size, train=True)
        if setting["normalize_in_workers"]:
            images = NormalizedInWorkers(images)
        workers = setting["workers"]
        loader = torch.utils.data.DataLoader(
            images, batch_size=args.batch_size, shuffle=True, drop_last=True,
            num_workers=workers, persistent_workers=setting["persistent"] and workers > 0,
            pin_memory=setting["pin_memory"],
            prefetch_factor=setting["prefetch_factor"] if workers else None)
        # prepare_data_loader(): what prepare() does to a loader, without keeping it (its
        # workers end with it)
        loader = prepare_data_loader(loader, self.device, num_processes=1, process_index=0,
                                     put_on_device=True, non_blocking=setting["non_blocking"])
        epochs = []
        for _ in range(args.epochs):
            started, first, steps = time.perf_counter(), None, 0
            loss_sum = torch.zeros((), device=self.device)
            for batch_images, labels in loader:
                first = first or time.perf_counter()
                loss_sum += self.step(batch_images, labels, setting["normalize_in_workers"])
                steps += 1
            loss_sum.item()  # waits for the device, as the example's epoch end does
            ended = time.perf_counter()
            epochs.append({"epoch_images_per_second": steps * args.batch_size / (ended - started),
                           "first_batch_s": first - started,
                           "after_first_images_per_second": steps * args.batch_size
                           / (ended - first)})
        del loader  # its workers end
        later = epochs[1:] or epochs  # the first epoch also starts the workers
        return {**{key: sum(epoch[key] for epoch in later) / len(later) for key in later[0]},
                "epochs": epochs}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import torchvision
    args.cpu = args.cpu or not torch.cuda.is_available()
    data_dir, classes = cv_throughput.make_images(args)
    args.image_size = args.image_size or (224 if args.scenario == "photos" else 64)
    examples = {"new": cv_throughput.load(args.example.resolve(), "cv_example")}
    if args.old:
        examples["old"] = cv_throughput.load(args.old.resolve(), "old_cv_example")
    _, train_set, _ = examples["new"].find_images(data_dir, 42)
    cpus = os.cpu_count()
    result = {"cpus": cpus, "torch": torch.__version__, "torchvision": torchvision.__version__,
              "scenario": args.scenario, "model": args.model, "image_size": args.image_size,
              "batch_size": args.batch_size, "mixed_precision": args.mixed_precision,
              "per_core": per_core(examples, train_set, args, args.rounds)}
    for name, rate in result["per_core"].items():
        print(f"per core, {name} example: {rate:,.0f} images/s", flush=True)
    if args.per_core_only:
        return 0
    trainer = Trainer(args, classes)
    result["device"] = trainer.device.type
    pures = [trainer.pure(classes)]
    print(f"pure step: {pures[0]:,.0f} images/s", flush=True)
    rows = {}
    for name, setting in variants(args, cpus).items():
        rows[name] = {**setting, **trainer.variant(examples[setting["example"]], train_set, setting)}
        print(f"{name}: {json.dumps(rows[name])}", flush=True)
    pures.append(trainer.pure(classes))
    pure = max(pures)
    result.update(pure_images_per_second=pures, variants=rows)
    print(f"\n{args.model} {args.mixed_precision} on {trainer.device.type}, {args.image_size} px, "
          f"batch {args.batch_size}, {cpus} CPUs; pure step {pures[0]:,.0f} / {pures[1]:,.0f} "
          "images/s (before / after)")
    print(f"{'variant':30} {'workers':>7} {'epoch img/s':>11} {'ratio':>5} {'1st batch s':>11} "
          f"{'after 1st':>9} {'ratio':>5}")
    for name, row in rows.items():
        print(f"{name:30} {row['workers']:>7} {row['epoch_images_per_second']:>11,.0f} "
              f"{row['epoch_images_per_second'] / pure:>5.2f} {row['first_batch_s']:>11.3f} "
              f"{row['after_first_images_per_second']:>9,.0f} "
              f"{row['after_first_images_per_second'] / pure:>5.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
