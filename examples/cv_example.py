"""Train a torchvision image classifier on a folder of images, on the device the launcher picks.

    python examples/make_demo_images.py images        # hand-written digits as JPEG files
    mpslaunch launch examples/cv_example.py --data_dir images --image_size 64 --num_epochs 2

It runs unchanged under `python`, `accelerate launch` and `mpslaunch launch`: `Accelerator()`
takes the device (mps, cuda or cpu), the precision and the processes from the launcher.
`--data_dir` holds .jpg/.jpeg/.png files named like the Oxford-IIIT Pet set (`Label_Name_123.jpg`)
or one sub-folder of images per class. Results: the eval accuracy after each epoch and
`--output_dir`/metrics.json. examples/complete_cv_example.py adds checkpoints and a clean stop.
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # metrics.json reports how long the imports and the first step take

import argparse
import json
import os
import random
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_image, read_file
from torchvision.transforms import v2
from tqdm.auto import tqdm

IMPORTS_DONE_AT = time.time()
PROG = "cv_example"


class InputError(Exception):
    """Bad input: reported as one line, `cv_example: error: ...`, and exit code 2."""


class UnreadableImage(InputError):
    def __init__(self, message: str):  # from a DataLoader worker, the message is a traceback
        super().__init__(message.strip().splitlines()[-1].split("UnreadableImage: ")[-1])


def find_images(data_dir: Path) -> list[tuple[Path, str]]:
    """(path, label) of every image: one sub-folder per class, else Pet-style file names."""
    if not data_dir.is_dir() or not any(data_dir.iterdir()):
        raise InputError(f"--data_dir {data_dir} is missing or empty; make a demo set with: "
                         f"python examples/make_demo_images.py {data_dir}")

    def is_image(path: Path) -> bool:  # `._name.jpg` files are macOS metadata
        return path.suffix.lower() in (".jpg", ".jpeg", ".png") \
            and not path.name.startswith(".") and path.is_file()

    entries = sorted(path for path in data_dir.iterdir() if not path.name.startswith("."))
    samples = [(path, folder.name) for folder in entries if folder.is_dir()
               for path in sorted(folder.rglob("*")) if is_image(path)]
    samples = samples or [(path, match[1]) for path in entries if is_image(path)
                          and (match := re.match(r"^(.+)_\d+$", path.stem))]
    if len({label for _, label in samples}) < 2:
        raise InputError(f"found images of {len({label for _, label in samples})} class(es) in "
                         f"{data_dir}; it needs two or more, as Label_Name_123.jpg files or "
                         "one sub-folder of images per class")
    return samples


def split_train_eval(samples: list, seed: int) -> tuple[list, list]:
    """80% to train, 20% to evaluate, shuffled by the seed."""
    shuffled = samples[:]
    random.Random(seed).shuffle(shuffled)
    eval_count = max(1, round(len(shuffled) * 0.2))
    return shuffled[eval_count:], shuffled[:eval_count]


class ImageFiles(Dataset):
    """(image, label) pairs: files decoded in DataLoader workers, transformed as uint8."""

    def __init__(self, samples: list[tuple[Path, int]], transform):
        self.samples, self.transform = samples, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        try:
            image = decode_image(read_file(str(path)), mode=ImageReadMode.RGB)
        except RuntimeError:
            raise UnreadableImage(f"cannot decode {path}: corrupt or not an image") from None
        image = v2.functional.to_dtype(image, torch.uint8, scale=True)  # 16-bit PNGs
        return self.transform(image), label


def make_transforms(size: int) -> tuple[v2.Compose, v2.Compose]:
    """Training: random crops of at least 35% of the picture (small pictures keep their
    subject) and flips. Evaluation: the centre."""
    return (v2.Compose([v2.RandomResizedCrop(size, scale=(0.35, 1.0)), v2.RandomHorizontalFlip()]),
            v2.Compose([v2.Resize(round(size / 0.875)), v2.CenterCrop(size)]))


def make_loader(dataset: Dataset, args, device: torch.device, **options) -> DataLoader:
    workers = args.num_workers
    if workers is None and device.type != "cpu":  # the CPU trains on all cores: decode in line
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        # The CPUs shared among this machine's processes, one each left to the training loop.
        workers = max(1, (cpus or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")) - 1)
    # Persistent workers start once (macOS spawns them: each imports torch again). Pinned
    # memory speeds copies to a CUDA device; MPS has none.
    return DataLoader(dataset, batch_size=args.batch_size, num_workers=workers or 0,
                      persistent_workers=bool(workers), pin_memory=device.type == "cuda",
                      **options)


def build_model(name: str, num_classes: int, pretrained: bool) -> torch.nn.Module:
    if not pretrained:
        return torchvision.models.get_model(name, num_classes=num_classes)
    model = torchvision.models.get_model(name, weights="DEFAULT")  # found in the cache first
    head, layer = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)][-1]
    model.set_submodule(head, torch.nn.Linear(layer.in_features, num_classes))
    return model


class Normalize:
    """uint8 batches travel to the device (4x less to copy than float32) and become float here."""

    def __init__(self, device: torch.device):
        self.mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
        # channels_last speeds convolutions up on CUDA and CPUs; on MPS its backward is slower.
        self.memory_format = torch.contiguous_format if device.type == "mps" \
            else torch.channels_last

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        images = images.contiguous(memory_format=self.memory_format)
        return (images.float() - self.mean) / self.std


def make_optimizer(model: torch.nn.Module, lr: float, total_steps: int):
    """AdamW on a one-cycle schedule: a warm-up to `lr`, then annealing."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr / 25)
    return optimizer, torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=total_steps)


def train_step(accelerator, model, optimizer, scheduler, normalize, images, labels):
    """One optimizer step; the loss stays on the device (reading it waits for the device)."""
    loss = F.cross_entropy(model(normalize(images)), labels)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def train(args, samples: list[tuple[Path, str]]) -> dict:
    # cpu=False and mixed_precision=None are Accelerator()'s defaults: the launcher decides.
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    device, normalize = accelerator.device, Normalize(accelerator.device)
    classes = sorted({label for _, label in samples})
    train_set, eval_set = split_train_eval([(p, classes.index(c)) for p, c in samples], args.seed)
    train_transform, eval_transform = make_transforms(args.image_size)
    train_loader = make_loader(ImageFiles(train_set, train_transform), args, device,
                               shuffle=True, drop_last=True)
    eval_loader = make_loader(ImageFiles(eval_set, eval_transform), args, device)
    set_seed(args.seed)
    model = build_model(args.model, len(classes), args.pretrained)
    model = model.to(memory_format=normalize.memory_format)
    # Steps counted before prepare() shares the batches out: each process steps the schedule.
    optimizer, scheduler = make_optimizer(model, args.lr, args.num_epochs * len(train_loader))
    model, optimizer, scheduler, train_loader, eval_loader = accelerator.prepare(
        model, optimizer, scheduler, train_loader, eval_loader)
    accelerator.print(f"{PROG}: {len(train_set)} train / {len(eval_set)} eval images, "
                      f"{len(classes)} classes; {args.model} on {device.type}, mixed precision "
                      f"{accelerator.mixed_precision}, {accelerator.num_processes} process(es)")
    accuracies, trained_images, train_s, first_step_at = [], 0, 0.0, None
    for epoch in range(args.num_epochs):
        bar = tqdm(train_loader, desc=f"epoch {epoch + 1}/{args.num_epochs}", unit="step",
                   dynamic_ncols=True, disable=not accelerator.is_local_main_process)
        started = shown_at = time.perf_counter()
        for images, labels in bar:
            loss = train_step(accelerator, model, optimizer, scheduler, normalize, images, labels)
            if first_step_at is None:  # start-up (kernels loaded, the first batch): not timed
                loss.item()  # waits for the device
                first_step_at, started = time.time(), time.perf_counter()
                continue
            trained_images += len(images) * accelerator.num_processes
            if time.perf_counter() - shown_at > 1:  # loss.item() waits: not at every step
                shown_at = time.perf_counter()
                rate = trained_images / (train_s + shown_at - started)
                bar.set_postfix(loss=f"{loss.item():.3f}", img_s=f"{rate:,.0f}")
        loss.item()  # the epoch ends when the device is done
        train_s += time.perf_counter() - started

        model.eval()
        correct = total = 0
        with torch.no_grad():
            for images, labels in eval_loader:
                predictions = model(normalize(images)).argmax(dim=1)
                # All processes' predictions, less the samples repeated to fill the last batch.
                predictions, labels = accelerator.gather_for_metrics((predictions, labels))
                correct, total = correct + (predictions == labels).sum(), total + len(labels)
        model.train()
        accuracies.append(int(correct) / total)
        accelerator.print(f"{PROG}: epoch {epoch + 1}: eval accuracy {accuracies[-1]:.4f}")
    accelerator.end_training()
    return {"eval_accuracy": accuracies[-1], "eval_accuracy_per_epoch": accuracies,
            "train_images_per_second": trained_images / train_s,
            "device": device.type, "mixed_precision": accelerator.mixed_precision,
            "num_processes": accelerator.num_processes, "model": args.model,
            "image_size": args.image_size, "batch_size": args.batch_size,
            "train_images": len(train_set), "eval_images": len(eval_set),
            "started_at": STARTED_AT, "imports_s": IMPORTS_DONE_AT - STARTED_AT,
            "first_step_s": first_step_at - STARTED_AT}


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # instead of printing the usage and exiting
        raise InputError(message)


def make_parser(prog: str = PROG, description: str = __doc__) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description=description.split("\n\n")[0])
    add = parser.add_argument
    add("--data_dir", type=Path, required=True, metavar="DIR",
        help="Label_Name_123.jpg files or one sub-folder of images per class")
    add("--output_dir", type=Path, default=Path("outputs", prog), metavar="DIR",
        help="for the results (default: %(default)s)")
    add("--model", default="resnet18",
        help="a torchvision classification model, trained from scratch (default: %(default)s)")
    add("--pretrained", action="store_true", help="start from ImageNet weights in torch's cache")
    add("--num_epochs", type=int, default=3, metavar="N", help="(default: %(default)s)")
    add("--batch_size", type=int, default=64, metavar="N",
        help="per process (default: %(default)s)")
    add("--image_size", type=int, default=224, metavar="PX", help="(default: %(default)s)")
    add("--lr", type=float, default=3e-3, help="peak learning rate (default: %(default)s)")
    add("--num_workers", type=int, metavar="N", help="DataLoader workers per process (default: "
        "the CPUs / local processes - 1; 0 when training on the CPU)")
    add("--seed", type=int, default=42,
        help="fixes the split, the weights, the augmentation (default: %(default)s)")
    add("--cpu", action="store_true", help="Accelerator(cpu=True), else the launcher's choice")
    add("--mixed_precision", choices=("no", "fp16", "bf16"),
        help="Accelerator(mixed_precision=...) (default: the launcher's choice)")
    return parser


def check_args(args) -> list[tuple[Path, str]]:
    """Every input checked before any device is touched; returns the images found."""
    for name in ("num_epochs", "batch_size", "image_size", "lr"):
        if not getattr(args, name) > 0:
            raise InputError(f"--{name} must be more than 0, got {getattr(args, name)}")
    if args.num_workers is not None and args.num_workers < 0:
        raise InputError(f"--num_workers must be 0 or more, got {args.num_workers}")
    samples = find_images(args.data_dir)
    if args.model not in torchvision.models.list_models(module=torchvision.models):
        raise InputError(f"unknown --model {args.model!r}; use a torchvision classification "
                         "model, e.g. resnet18, resnet50, mobilenet_v3_small, efficientnet_b0")
    if args.pretrained:  # where torchvision looks before it downloads
        url = torchvision.models.get_model_weights(args.model).DEFAULT.url
        cached = Path(torch.hub.get_dir(), "checkpoints", url.rsplit("/", 1)[-1])
        if not cached.is_file():
            raise InputError(f"--pretrained: {cached} is missing and nothing is downloaded here;"
                             " fetch the weights once with: python -c \"import torchvision; "
                             f"torchvision.models.get_model('{args.model}', weights='DEFAULT')\"")
    train_count = len(split_train_eval(samples, args.seed)[0])
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's, as Accelerator() reads it
    if train_count // args.batch_size < processes:  # each needs a full batch
        raise InputError(f"--batch_size {args.batch_size} x {processes} process(es) is more "
                         f"than the {train_count} training images")
    return samples


def main(argv: list[str] | None = None) -> int:
    main_rank = os.environ.get("RANK", "0") == "0"  # torchrun's: one process reports bad input
    try:
        args = make_parser().parse_args(argv)
        metrics = train(args, check_args(args))
    except InputError as error:
        if main_rank or isinstance(error, UnreadableImage):  # each process decodes its own
            print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    if main_rank:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        (args.output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        print(f"{PROG}: eval accuracy {metrics['eval_accuracy']:.4f}, "
              f"{metrics['train_images_per_second']:,.0f} training images/s; "
              f"wrote {args.output_dir / 'metrics.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
