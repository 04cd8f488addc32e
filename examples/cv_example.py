"""Train a torchvision image classifier on a folder of images, on the device the launcher picks.

    python examples/make_demo_images.py images        # hand-written digits as JPEG files
    mpslaunch launch examples/cv_example.py --data_dir images --image_size 64 --num_epochs 2

It runs unchanged under `python`, `accelerate launch` and `mpslaunch launch`: `Accelerator()`
takes the device (mps, cuda or cpu), the precision and the processes from the launcher.
`--data_dir` holds .jpg/.jpeg/.png files named like the Oxford-IIIT Pet set (`Label_Name_123.jpg`)
or one sub-folder of images per class. Each epoch ends with a line: its mean loss, training
images/s and the eval accuracy (on a terminal a progress bar shows them as it trains); the
results go to `--output_dir`/metrics.json. examples/complete_cv_example.py adds checkpoints and
a clean stop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import struct
import sys
import time
import zlib
from pathlib import Path

import torch
import torchvision
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_image, read_file
from torchvision.transforms import v2
from tqdm.auto import tqdm

PROG = "cv_example"


class InputError(Exception):
    """Bad input: reported as one line, `cv_example: error: ...`, and exit code 2."""


class UnreadableImage(InputError):
    def __init__(self, message: str):  # from a DataLoader worker, the message is a traceback
        super().__init__(message.strip().splitlines()[-1].split("UnreadableImage: ")[-1])


def find_images(data_dir: Path, seed: int) -> tuple[list[str], list, list]:
    """The class names, then (path, class) of the training and of the evaluation images (80/20,
    by the seed), from one sub-folder per class or else Pet-style file names."""
    if not data_dir.is_dir() or not any(data_dir.iterdir()):
        raise InputError(f"--data_dir {data_dir} is missing or empty; make a demo set with: "
                         f"python examples/make_demo_images.py {data_dir}")
    paths = sorted(path for path in data_dir.rglob("*") if path.is_file()  # not macOS `._*`:
                   and not any(part.startswith(".") for part in path.relative_to(data_dir).parts)
                   and path.suffix.lower() in (".jpg", ".jpeg", ".png"))
    samples = [(path, path.relative_to(data_dir).parts[0]) for path in paths
               if path.parent != data_dir]
    samples = samples or [(path, match[1]) for path in paths
                          if (match := re.match(r"^(.+)_\d+$", path.stem))]
    classes = sorted({label for _, label in samples})
    if len(classes) < 2:
        raise InputError(f"found images of {len(classes)} class(es) in {data_dir}; it needs two "
                         "or more, as Label_Name_123.jpg files or one sub-folder per class")
    samples = [(path, classes.index(label)) for path, label in samples]
    random.Random(seed).shuffle(samples)
    eval_count = max(1, round(len(samples) * 0.2))
    return classes, samples[eval_count:], samples[:eval_count]


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # by colour type: grey, RGB, palette, +alpha
ADAM7_PASSES = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
                (1, 0, 2, 2), (0, 1, 1, 2))  # (first column, first row, column step, row step)


def check_png(data: bytes) -> None:
    """ValueError if a PNG's rows are damaged (a chunk checksum, the compressed stream, too few
    rows, a bad row filter). torchvision's PNG decoder ends the whole process on those."""
    chunks, offset = {}, len(PNG_SIGNATURE)  # {kind: [bodies]}
    while offset + 12 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, offset)
        body, crc = data[offset + 8:offset + 8 + length], data[offset + 8 + length:][:4]
        if len(crc) < 4 or zlib.crc32(body, zlib.crc32(kind)) != int.from_bytes(crc, "big"):
            raise ValueError(f"the {kind.decode(errors='replace')} chunk is damaged")
        chunks.setdefault(kind, []).append(body)  # the image data spans IDAT chunks
        offset += 12 + length
        if kind == b"IEND":
            break
    header = b"".join(chunks.get(b"IHDR", []))
    if len(header) != 13:
        raise ValueError("no PNG header")
    width, height, depth, colour, _, _, interlaced = struct.unpack(">IIBBBBB", header)
    if not width or not height or colour not in PNG_CHANNELS:
        raise ValueError("a bad PNG header")
    inflate, pending = zlib.decompressobj(), b"".join(chunks.get(b"IDAT", []))
    for column, row, column_step, row_step in ADAM7_PASSES if interlaced else ((0, 0, 1, 1),):
        columns = max(0, math.ceil((width - column) / column_step))  # this pass's picture
        rows = max(0, math.ceil((height - row) / row_step)) if columns else 0
        row_bytes = 1 + (columns * PNG_CHANNELS[colour] * depth + 7) // 8  # filter byte first
        for _ in range(rows):
            try:  # one row at a time: the memory stays small whatever the header claims
                line, pending = inflate.decompress(pending, row_bytes), inflate.unconsumed_tail
            except zlib.error as error:
                raise ValueError(f"its image data is damaged: {error}") from None
            if len(line) < row_bytes or line[0] > 4:
                raise ValueError("its image data stops early or is damaged")


def decode(path: Path) -> torch.Tensor:
    """The picture in a JPEG or PNG file as a uint8 (3, height, width) RGB tensor."""
    data = read_file(str(path))
    try:
        if bytes(data[:8].numpy()) == PNG_SIGNATURE:
            check_png(data.numpy().tobytes())
        image = decode_image(data, mode=ImageReadMode.RGB)
    except (RuntimeError, ValueError):
        raise UnreadableImage(f"cannot decode {path}: corrupt or not an image") from None
    return v2.functional.to_dtype(image, torch.uint8, scale=True)  # 16-bit PNGs


class ImageFiles(Dataset):
    """(image, label): decoded in DataLoader workers, augmented as uint8 when training (random
    crops of at least 35% of the picture, so small pictures keep their subject, and flips)."""

    def __init__(self, samples: list[tuple[Path, int]], image_size: int, train: bool):
        self.samples, self.image_size = samples, image_size
        self.transform = v2.Compose(
            [v2.RandomResizedCrop(image_size, scale=(0.35, 1.0)), v2.RandomHorizontalFlip()]
            if train else [v2.Resize(round(image_size / 0.875)), v2.CenterCrop(image_size)])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return self.transform(decode(path)), label


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
    if name not in torchvision.models.list_models(module=torchvision.models):
        raise InputError(f"unknown --model {name!r}; use a torchvision classification model, "
                         "e.g. resnet18, resnet50, mobilenet_v3_small, efficientnet_b0")
    if not pretrained:
        return torchvision.models.get_model(name, num_classes=num_classes)
    url = torchvision.models.get_model_weights(name).DEFAULT.url
    cached = Path(torch.hub.get_dir(), "checkpoints", url.rsplit("/", 1)[-1])
    if not cached.is_file():  # where torchvision looks before it downloads
        raise InputError(f"--pretrained: {cached} is missing and nothing is downloaded here; "
                         f"fetch the weights once with: python -c \"import torchvision; "
                         f"torchvision.models.get_model('{name}', weights='DEFAULT')\"")
    model = torchvision.models.get_model(name, weights="DEFAULT")
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
    loss = torch.nn.functional.cross_entropy(model(normalize(images)), labels)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def progress_bar(accelerator, description: str, total_images: int, done: int = 0) -> tqdm:
    """A bar of images and images/s, on a terminal only (disable=None: none in a log), drawn
    by the first process of each machine."""
    return tqdm(total=total_images, initial=done, desc=description, unit="img", leave=False,
                dynamic_ncols=True, disable=None if accelerator.is_local_main_process else True)


def train_epoch(accelerator, model, optimizer, scheduler, normalize, loader,
                description: str) -> tuple[float, float]:
    """One pass over the training images: their mean loss and the images/s."""
    images_per_step = loader.total_batch_size  # all processes' batches
    bar = progress_bar(accelerator, description, len(loader) * images_per_step)
    started, loss_sum = time.perf_counter(), torch.zeros((), device=accelerator.device)
    for step, (images, labels) in enumerate(loader, start=1):
        loss_sum += train_step(accelerator, model, optimizer, scheduler, normalize, images, labels)
        if bar.update(images_per_step):  # True when it redraws: reading the loss waits for
            bar.set_postfix(loss=f"{loss_sum.item() / step:.3f}", refresh=False)  # the device
    bar.close()
    mean_loss = accelerator.reduce(loss_sum, reduction="mean").item() / len(loader)
    return mean_loss, len(loader) * images_per_step / (time.perf_counter() - started)


@torch.no_grad()
def evaluate(accelerator, model, normalize, loader) -> float:
    """The accuracy on the evaluation images."""
    model.eval()
    correct = total = 0
    for images, labels in loader:
        predictions = model(normalize(images)).argmax(dim=1)
        # All processes' predictions, less the samples repeated to fill the last batch.
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        correct, total = correct + (predictions == labels).sum(), total + len(labels)
    model.train()
    return int(correct) / total


def check_batch_size(args, train_count: int) -> None:
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's, as Accelerator() reads it
    if train_count // args.batch_size < processes:  # each needs a full batch
        raise InputError(f"--batch_size {args.batch_size} x {processes} process(es) is more "
                         f"than the {train_count} training images")


def train(args) -> dict:
    classes, train_set, eval_set = find_images(args.data_dir, args.seed)
    set_seed(args.seed)
    model = build_model(args.model, len(classes), args.pretrained)
    check_batch_size(args, len(train_set))  # bad input is found before the device is touched
    # cpu=False and mixed_precision=None are Accelerator()'s defaults: the launcher decides.
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    device, normalize = accelerator.device, Normalize(accelerator.device)
    model = model.to(memory_format=normalize.memory_format)
    train_loader = make_loader(ImageFiles(train_set, args.image_size, train=True), args, device,
                               shuffle=True, drop_last=True)
    eval_loader = make_loader(ImageFiles(eval_set, args.image_size, train=False), args, device)
    # Steps counted before prepare() shares the batches out: each process steps the schedule.
    optimizer, scheduler = make_optimizer(model, args.lr, args.num_epochs * len(train_loader))
    model, optimizer, scheduler, train_loader, eval_loader = accelerator.prepare(
        model, optimizer, scheduler, train_loader, eval_loader)
    accelerator.print(f"{PROG}: {len(train_set)} train / {len(eval_set)} eval images, "
                      f"{len(classes)} classes; {args.model} on {device.type}, mixed precision "
                      f"{accelerator.mixed_precision}, {accelerator.num_processes} process(es)")
    accuracies = []
    for epoch in range(1, args.num_epochs + 1):
        loss, images_per_second = train_epoch(accelerator, model, optimizer, scheduler,
                                              normalize, train_loader,
                                              f"epoch {epoch}/{args.num_epochs}")
        accuracies.append(evaluate(accelerator, model, normalize, eval_loader))
        accelerator.print(f"{PROG}: epoch {epoch}/{args.num_epochs}: loss {loss:.3f}, "
                          f"{images_per_second:,.0f} training images/s, "
                          f"eval accuracy {accuracies[-1]:.4f}")
    accelerator.end_training()
    return {"eval_accuracy": accuracies[-1], "eval_accuracy_per_epoch": accuracies,
            "device": device.type, "mixed_precision": accelerator.mixed_precision,
            "num_processes": accelerator.num_processes, "model": args.model,
            "image_size": args.image_size, "batch_size": args.batch_size,
            "train_images": len(train_set), "eval_images": len(eval_set)}


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # instead of printing the usage and exiting
        raise InputError(message)


def make_parser(prog: str = PROG, description: str = __doc__) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description=description.split("\n\n")[0])
    add = parser.add_argument
    add("--data_dir", type=Path, required=True, metavar="DIR",
        help="Label_Name_123.jpg files or one sub-folder of images per class")
    add("--output_dir", type=Path, default=Path("outputs", prog), metavar="DIR",
        help="(default: %(default)s)")
    add("--model", default="resnet18", help="a torchvision classifier (default: %(default)s)")
    add("--pretrained", action="store_true", help="start from ImageNet weights in torch's cache")
    add("--num_epochs", type=int, default=3, help="(default: %(default)s)")
    add("--batch_size", type=int, default=64, help="per process (default: %(default)s)")
    add("--image_size", type=int, default=224, help="(default: %(default)s)")
    add("--lr", type=float, default=3e-3, help="peak learning rate (default: %(default)s)")
    add("--num_workers", type=int, help="DataLoader workers per process (default: "
        "the CPUs / local processes - 1; 0 when training on the CPU)")
    add("--seed", type=int, default=42, help="fixes the split, the weights, the augmentation "
        "(default: %(default)s)")
    add("--cpu", action="store_true", help="Accelerator(cpu=True), else the launcher's choice")
    add("--mixed_precision", choices=("no", "fp16", "bf16"), help="(default: the launcher's)")
    return parser


def parse_args(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None):
    args = (parser or make_parser()).parse_args(argv)
    for name in ("num_epochs", "batch_size", "image_size", "lr"):
        if not getattr(args, name) > 0:
            raise InputError(f"--{name} must be more than 0, got {getattr(args, name)}")
    if args.num_workers is not None and args.num_workers < 0:
        raise InputError(f"--num_workers must be 0 or more, got {args.num_workers}")
    return args


def main(argv: list[str] | None = None) -> int:
    main_rank = os.environ.get("RANK", "0") == "0"  # torchrun's: one process reports bad input
    try:
        args = parse_args(argv)
        metrics = train(args)
    except InputError as error:
        if main_rank or isinstance(error, UnreadableImage):  # each process decodes its own
            print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    if main_rank:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        (args.output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        print(f"{PROG}: eval accuracy {metrics['eval_accuracy']:.4f}; "
              f"wrote {args.output_dir / 'metrics.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
