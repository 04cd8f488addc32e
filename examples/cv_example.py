"""Train a torchvision image classifier on a folder of images, on the device the launcher picks.

    python examples/make_demo_images.py images        # hand-written digits as JPEG files
    mpslaunch launch examples/cv_example.py --data_dir images --image_size 64 --num_epochs 2

It runs unchanged under `python`, `accelerate launch` and `mpslaunch launch`: `Accelerator()` takes
the device (mps, cuda or cpu), the precision and the processes from the launcher's environment.
`--data_dir` holds .jpg/.jpeg/.png files named like the Oxford-IIIT Pet set (`Label_Name_123.jpg`:
the label is the name before the last `_`) or one sub-folder of images per class; 80% train and
20% evaluate, split by `--seed`. Results: the eval accuracy after each epoch and metrics.json in
`--output_dir`. examples/complete_cv_example.py adds checkpoints, resuming and a clean stop.
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # metrics.json reports how long the imports and the first step took

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
PET_NAME = re.compile(r"^(.+)_\d+$")  # a file name without its suffix: Label_Name_123


class InputError(Exception):
    """Bad input: reported as one line, `cv_example: error: ...`, and exit code 2."""


class UnreadableImage(InputError):
    """Raised in a DataLoader worker, it comes back with the worker's traceback as its message."""

    def __init__(self, message: str):
        super().__init__(message.strip().splitlines()[-1].split("UnreadableImage: ")[-1])


def is_image(path: Path) -> bool:
    return path.suffix.lower() in (".jpg", ".jpeg", ".png") and not path.name.startswith(".") \
        and path.is_file()


def find_images(data_dir: Path) -> list[tuple[Path, str]]:
    """(path, label) of every image: one sub-folder per class, else Pet-style file names."""
    if not data_dir.is_dir() or not any(data_dir.iterdir()):
        raise InputError(f"--data_dir {data_dir} is missing or empty; make a demo set with: "
                         f"python examples/make_demo_images.py {data_dir}")
    entries = sorted(path for path in data_dir.iterdir() if not path.name.startswith("."))
    samples = [(path, folder.name) for folder in entries if folder.is_dir()
               for path in sorted(folder.rglob("*")) if is_image(path)]
    samples = samples or [(path, match[1]) for path in entries if is_image(path)
                          and (match := PET_NAME.match(path.stem))]
    if len({label for _, label in samples}) < 2:
        raise InputError(f"found images of {len({label for _, label in samples})} class(es) in "
                         f"{data_dir}; it needs two or more, as Label_Name_123.jpg files or "
                         "one sub-folder of images per class")
    return samples


def split_train_eval(samples: list, seed: int) -> tuple[list, list]:
    shuffled = samples[:]
    random.Random(seed).shuffle(shuffled)
    eval_count = max(1, round(len(shuffled) * 0.2))
    return shuffled[eval_count:], shuffled[:eval_count]


class ImageFiles(Dataset):
    """Image files decoded to uint8 (3, H, W) tensors and transformed (in DataLoader workers)."""

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


def train_transform(size: int) -> v2.Compose:
    # Crops of at least 35% of the picture: small pictures keep their subject.
    return v2.Compose([v2.RandomResizedCrop(size, scale=(0.35, 1.0), antialias=True),
                       v2.RandomHorizontalFlip()])


def eval_transform(size: int) -> v2.Compose:
    return v2.Compose([v2.Resize(round(size / 0.875), antialias=True), v2.CenterCrop(size)])


def make_loader(dataset: Dataset, args, device: torch.device, **options) -> DataLoader:
    workers = args.num_workers
    if workers is None and device.type != "cpu":  # the CPU trains on all cores: decode in line
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        # The cores shared among this machine's processes, one each left to the training loop.
        workers = max(1, (cpus or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")) - 1)
    # Persistent workers start once (macOS spawns them: each imports torch again). Pinned
    # memory speeds copies to a CUDA device; MPS has none.
    return DataLoader(dataset, batch_size=args.batch_size, num_workers=workers or 0,
                      persistent_workers=bool(workers), pin_memory=device.type == "cuda",
                      **options)


def check_model(name: str, pretrained: bool) -> None:
    if name not in torchvision.models.list_models(module=torchvision.models):
        raise InputError(f"unknown --model {name!r}; use a torchvision classification model, "
                         "e.g. resnet18, resnet50, mobilenet_v3_small, efficientnet_b0")
    if not pretrained:
        return
    url = torchvision.models.get_model_weights(name).DEFAULT.url
    cached = Path(torch.hub.get_dir(), "checkpoints", url.rsplit("/", 1)[-1])
    if not cached.is_file():  # where torchvision looks before it downloads
        raise InputError(f"--pretrained: {cached} is missing and nothing is downloaded here; "
                         f"fetch the weights once with: python -c \"import torchvision; "
                         f"torchvision.models.get_model('{name}', weights='DEFAULT')\"")


def build_model(name: str, num_classes: int, pretrained: bool) -> torch.nn.Module:
    if not pretrained:
        return torchvision.models.get_model(name, num_classes=num_classes)
    model = torchvision.models.get_model(name, weights="DEFAULT")  # from the cache
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


@torch.no_grad()
def evaluate(accelerator, model, normalize, loader) -> float:
    model.eval()
    correct = total = 0
    for images, labels in loader:
        predictions = model(normalize(images)).argmax(dim=1)
        # All processes' predictions, less the samples repeated to even out the last batch.
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        correct, total = correct + (predictions == labels).sum(), total + len(labels)
    model.train()
    return int(correct) / total


class Speed:
    """Training images/s of all processes, eval left out, and the progress bar's figures.
    The first step is start-up (loading kernels, the first batch): it ends at first_step_at,
    and the rate counts from there."""

    def __init__(self):
        self.images, self.seconds, self.first_step_at = 0, 0.0, None

    def start_epoch(self) -> None:
        self.started, self.epoch_images, self.shown_at = time.perf_counter(), 0, 0.0

    def step(self, images: int, loss: torch.Tensor, bar: tqdm) -> None:
        self.epoch_images += images
        if self.first_step_at is None:
            loss.item()  # waits for the device
            self.first_step_at = time.time()
            self.start_epoch()
        if time.perf_counter() - self.shown_at > 1:  # loss.item() waits: not at every step
            self.shown_at = time.perf_counter()
            rate = self.epoch_images / max(self.shown_at - self.started, 1e-9)
            bar.set_postfix(loss=f"{loss.item():.3f}", img_s=f"{rate:,.0f}")

    def end_epoch(self, loss: torch.Tensor | None) -> None:
        if loss is not None:
            loss.item()  # the epoch ends when the device is done
        self.seconds += time.perf_counter() - self.started
        self.images += self.epoch_images

    @property
    def images_per_second(self) -> float | None:
        return self.images / self.seconds if self.seconds else None


def train_epoch(accelerator, model, optimizer, scheduler, normalize, loader, speed: Speed,
                description: str) -> None:
    bar = tqdm(loader, desc=description, unit="step", dynamic_ncols=True,
               disable=not accelerator.is_local_main_process)
    speed.start_epoch()
    for images, labels in bar:
        loss = train_step(accelerator, model, optimizer, scheduler, normalize, images, labels)
        speed.step(len(images) * accelerator.num_processes, loss, bar)
    speed.end_epoch(loss)


def make_accelerator(args: argparse.Namespace) -> Accelerator:
    """--cpu and --mixed_precision count only when given: else the launcher's plan decides."""
    options = {"cpu": True} if args.cpu else {}
    if args.mixed_precision:
        options["mixed_precision"] = args.mixed_precision
    return Accelerator(**options)


def train(args: argparse.Namespace, samples: list[tuple[Path, str]]) -> dict:
    accelerator = make_accelerator(args)
    device, normalize = accelerator.device, Normalize(accelerator.device)
    classes = sorted({label for _, label in samples})
    train_set, eval_set = split_train_eval([(p, classes.index(c)) for p, c in samples], args.seed)
    train_loader = make_loader(ImageFiles(train_set, train_transform(args.image_size)), args,
                               device, shuffle=True, drop_last=True)
    eval_loader = make_loader(ImageFiles(eval_set, eval_transform(args.image_size)), args, device)
    set_seed(args.seed)
    model = build_model(args.model, len(classes), args.pretrained)
    model = model.to(memory_format=normalize.memory_format)
    # Steps counted before prepare() shares the batches out among the processes: the prepared
    # schedule steps once per process at each step.
    optimizer, scheduler = make_optimizer(model, args.lr, args.num_epochs * len(train_loader))
    model, optimizer, scheduler, train_loader, eval_loader = accelerator.prepare(
        model, optimizer, scheduler, train_loader, eval_loader)
    accelerator.print(f"{PROG}: {len(train_set)} train / {len(eval_set)} eval images, "
                      f"{len(classes)} classes; {args.model} on {device.type}, mixed precision "
                      f"{accelerator.mixed_precision}, {accelerator.num_processes} process(es)")
    speed, accuracies = Speed(), []
    for epoch in range(args.num_epochs):
        train_epoch(accelerator, model, optimizer, scheduler, normalize, train_loader, speed,
                    f"epoch {epoch + 1}/{args.num_epochs}")
        accuracies.append(evaluate(accelerator, model, normalize, eval_loader))
        accelerator.print(f"{PROG}: epoch {epoch + 1}: eval accuracy {accuracies[-1]:.4f}")
    accelerator.end_training()
    return {"eval_accuracy": accuracies[-1], "eval_accuracy_per_epoch": accuracies,
            "train_images_per_second": speed.images_per_second,
            "device": device.type, "mixed_precision": accelerator.mixed_precision,
            "num_processes": accelerator.num_processes, "model": args.model,
            "image_size": args.image_size, "batch_size": args.batch_size,
            "train_images": len(train_set), "eval_images": len(eval_set),
            "started_at": STARTED_AT, "imports_s": IMPORTS_DONE_AT - STARTED_AT,
            "first_step_s": speed.first_step_at - STARTED_AT}


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


def parse_args(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None):
    args = (parser or make_parser()).parse_args(argv)
    for name in ("num_epochs", "batch_size", "image_size", "lr"):
        if not getattr(args, name) > 0:
            raise InputError(f"--{name} must be more than 0, got {getattr(args, name)}")
    if args.num_workers is not None and args.num_workers < 0:
        raise InputError(f"--num_workers must be 0 or more, got {args.num_workers}")
    return args


def check_batch_size(batch_size: int, samples: list, seed: int) -> None:
    """Every process needs a full batch (a smaller last one is dropped)."""
    train_count = len(split_train_eval(samples, seed)[0])
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's, as Accelerator() reads it
    if train_count // batch_size < processes:
        raise InputError(f"--batch_size {batch_size} x {processes} process(es) is more than the "
                         f"{train_count} training images")


def main(argv: list[str] | None = None) -> int:
    main_rank = os.environ.get("RANK", "0") == "0"  # torchrun's: one process reports bad input
    try:
        args = parse_args(argv)
        samples = find_images(args.data_dir)  # cheap checks before any device is touched
        check_model(args.model, args.pretrained)
        check_batch_size(args.batch_size, samples, args.seed)
        metrics = train(args, samples)
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
