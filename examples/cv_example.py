"""Train a torchvision image classifier on a folder of images, on the device the launcher picks.

    python examples/make_demo_images.py images        # hand-written digits as JPEG files
    mpslaunch launch examples/cv_example.py --data_dir images --image_size 64 --num_epochs 2

It runs unchanged under `python` and `accelerate launch` too. Images: .jpg/.jpeg/.png files named
like the Oxford-IIIT Pet set's (`Label_Name_123.jpg`) or in one sub-folder per class.
"""

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import torch
import torchvision
from accelerate import Accelerator
from accelerate.utils import set_seed
from PIL import Image
from torch.utils.data import DataLoader, Dataset, random_split
from torchvision.io import ImageReadMode, decode_jpeg, read_file
from torchvision.transforms import v2
from tqdm.auto import tqdm

PROG = "cv_example"
SKIPPED = -100  # the label of an image that does not decode: loss and accuracy leave it out


class InputError(Exception):
    """Bad input: reported as one line, `cv_example: error: ...`, and exit code 2."""


def find_images(data_dir: Path, seed: int) -> tuple[list[str], list, list]:
    """The class names, then the training and the evaluation (path, class) pairs, 80/20."""
    samples = []
    for path in sorted(data_dir.rglob("*")):  # the class: a sub-folder, or a Pet-style name
        parts, named = path.relative_to(data_dir).parts, re.match(r"(.+)_\d+$", path.stem)
        label = parts[0] if len(parts) > 1 else named and named[1]
        if label and path.suffix.lower() in (".jpg", ".jpeg", ".png") and path.is_file() \
                and not any(part.startswith(".") for part in parts):  # not macOS `._*` files
            samples.append((path, label))
    classes = sorted({label for _, label in samples})
    if len(classes) < 2:  # a missing or empty folder, one of other files, one of one class
        found = f"images of {len(classes)} class(es)" if data_dir.is_dir() else "no such folder"
        raise InputError(f"--data_dir {data_dir}: {found}; it needs Label_Name_123.jpg files or "
                         "one sub-folder of .jpg/.png files per class, two classes or more "
                         f"(a demo set: python examples/make_demo_images.py {data_dir})")
    samples = [(path, classes.index(label)) for path, label in samples]
    eval_count = max(1, round(len(samples) * 0.2))
    return classes, *random_split(samples, [len(samples) - eval_count, eval_count],
                                  generator=torch.Generator().manual_seed(seed))


class ImageFiles(Dataset):
    """(uint8 image, label), decoded and cropped in workers; `unreadable` marks damaged files."""

    def __init__(self, samples: list[tuple[Path, int]], image_size: int, train: bool):
        self.samples, self.image_size = samples, image_size
        self.unreadable = torch.zeros(len(samples), dtype=torch.bool).share_memory_()
        self.transform = v2.Compose(
            [v2.RandomResizedCrop(image_size, scale=(0.35, 1.0)), v2.RandomHorizontalFlip()]
            if train else [v2.Resize(round(image_size / 0.875)), v2.CenterCrop(image_size)])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        try:  # torchvision's JPEG reader (libjpeg-turbo), the quickest
            image = decode_jpeg(read_file(str(path)), mode=ImageReadMode.RGB)
        except RuntimeError:  # a PNG or a damaged file: Pillow, which raises on a damaged one
            try:  # (torchvision's PNG reader can crash the process on those)
                with Image.open(path) as picture:
                    image = v2.functional.pil_to_tensor(picture.convert("RGB"))
            except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
                self.unreadable[index] = True
                return torch.zeros(3, self.image_size, self.image_size, dtype=torch.uint8), SKIPPED
        return self.transform(image), label


def normalize(images: torch.Tensor) -> torch.Tensor:  # uint8 batches: 4x less to copy than float
    return (images.float() - 114.5) / 57.6  # ImageNet's mean and spread of pixel values


def train_epoch(accelerator, model, optimizer, scheduler, loader, title: str):
    """One pass over the training images: their mean loss and the images/s."""
    images_per_step = loader.total_batch_size  # all processes' batches
    # A bar on a terminal (none in a log) from each machine's first process (mps has only one).
    with tqdm(total=len(loader) * images_per_step, unit="img", leave=False, dynamic_ncols=True,
              desc=title, disable=None if accelerator.is_local_main_process else True) as bar:
        started, loss_sum = time.perf_counter(), torch.zeros((), device=accelerator.device)
        for step, (images, labels) in enumerate(loader, start=1):
            loss = torch.nn.functional.cross_entropy(model(normalize(images)), labels,
                                                     reduction="sum", ignore_index=SKIPPED)
            loss = loss / (labels != SKIPPED).sum().clamp_min(1)  # the mean over decoded images
            accelerator.backward(loss)  # scales fp16 losses; DDP averages the processes'
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach()  # on the device: no waiting for it
            if bar.update(images_per_step):  # True when it redraws: reading the loss waits for
                bar.set_postfix(loss=f"{loss_sum.item() / step:.3f}", refresh=False)  # the device
    # reduce(): the mean over the processes (one keeps its own)
    mean_loss = accelerator.reduce(loss_sum, reduction="mean").item() / len(loader)
    return mean_loss, len(loader) * images_per_step / (time.perf_counter() - started)


@torch.no_grad()
def evaluate(accelerator, model, loader) -> float:
    model.eval()
    correct = total = 0
    for images, labels in loader:
        predictions = model(normalize(images)).argmax(dim=1)
        # gather_for_metrics(): all processes' predictions (mps: one), less the last batch's fill
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        correct, total = correct + (predictions == labels).sum(), total + (labels != SKIPPED).sum()
    model.train()
    return int(correct) / max(1, int(total))


def train(args) -> None:
    classes, train_set, eval_set = find_images(args.data_dir, args.seed)
    set_seed(args.seed)  # Python's, NumPy's and torch's generators (the devices' too)
    if args.model not in torchvision.models.list_models(module=torchvision.models):
        raise InputError(f"unknown --model {args.model!r}; use a torchvision classification "
                         "model, e.g. resnet18, resnet50, mobilenet_v3_small, efficientnet_b0")
    model = torchvision.models.get_model(args.model, num_classes=len(classes))
    # Accelerator(): the launcher's device (mps, a GPU or the CPU), precision and processes
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    device, processes = accelerator.device, accelerator.num_processes
    if len(train_set) < args.batch_size * processes:  # each process needs a full batch
        raise InputError(f"--batch_size {args.batch_size} x {processes} process(es) is more than "
                         f"the {len(train_set)} training images")
    datasets = [ImageFiles(samples, args.image_size, train=samples is train_set)
                for samples in (train_set, eval_set)]
    # In line on the CPU (it trains on all cores); beside a GPU, persistent workers (macOS spawns
    # them) on all CPUs but one per process, and pinned copies during the step (mps pins none).
    workers, local_processes = args.num_workers, int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if workers is None:
        workers = 0 if device.type == "cpu" else max(1, os.cpu_count() // local_processes - 1)
    accelerator.dataloader_config.non_blocking = pinned = device.type not in ("cpu", "mps")
    options = dict(batch_size=args.batch_size, num_workers=workers, persistent_workers=workers > 0,
                   pin_memory=pinned)
    train_loader = DataLoader(datasets[0], shuffle=True, drop_last=True, **options)
    eval_loader = DataLoader(datasets[1], **options)
    if device.type != "mps":  # channels_last speeds convolutions up on GPUs and CPUs, not mps
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr / 25)  # one cycle: a warm-up
    scheduler = torch.optim.lr_scheduler.OneCycleLR(  # to --lr, then down; the steps counted
        optimizer, args.lr, total_steps=args.num_epochs * len(train_loader))  # before prepare()
    # prepare(): the model to the device (in DDP with processes); each loader its share, there
    model, optimizer, scheduler, train_loader, eval_loader = accelerator.prepare(
        model, optimizer, scheduler, train_loader, eval_loader)
    accuracies = []
    for epoch in range(1, args.num_epochs + 1):
        loss, images_per_second = train_epoch(accelerator, model, optimizer, scheduler,
                                              train_loader, f"epoch {epoch}/{args.num_epochs}")
        accuracies.append(evaluate(accelerator, model, eval_loader))
        accelerator.print(f"{PROG}: epoch {epoch}/{args.num_epochs}: loss {loss:.3f}, "  # once
                          f"{images_per_second:,.0f} training images/s, eval accuracy "
                          f"{accuracies[-1]:.4f}")
    marks = torch.cat([dataset.unreadable for dataset in datasets]).to(device)  # all processes':
    skipped = accelerator.reduce(marks.int(), reduction="sum").nonzero().flatten().tolist()
    if accelerator.is_main_process:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        (args.output_dir / "metrics.json").write_text(json.dumps({
            "eval_accuracy": accuracies[-1], "eval_accuracy_per_epoch": accuracies,
            "device": device.type, "mixed_precision": accelerator.mixed_precision,
            "num_processes": processes, "train_images": len(train_set),
            "eval_images": len(eval_set),
            "skipped_images": [str((train_set + eval_set)[i][0]) for i in skipped]}, indent=2))
        print(f"{PROG}: eval accuracy {accuracies[-1]:.4f}; {len(skipped)} unreadable image(s) "
              f"skipped; wrote {args.output_dir / 'metrics.json'}")
    accelerator.end_training()  # ends the trackers; several processes leave their group


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # instead of printing the usage and exiting
        raise InputError(message)


def parse_args(argv: list[str] | None = None):
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("--data_dir", type=Path, required=True, help="Label_Name_123.jpg files or class folders")
    add("--output_dir", type=Path, default=Path("outputs", PROG), help="for metrics.json")
    add("--model", default="resnet18", help="a torchvision classifier")
    add("--num_epochs", type=int, default=3, help="epochs")
    add("--batch_size", type=int, default=64, help="per process")
    add("--image_size", type=int, default=224, help="pixels a side")
    add("--lr", type=float, default=3e-3, help="peak learning rate")
    add("--num_workers", type=int, help="per process (by default 0 on the CPU, else the CPUs)")
    add("--seed", type=int, default=42, help="fixes the split, the weights, the augmentation")
    add("--cpu", action="store_true", help="Accelerator(cpu=True), else the launcher's choice")
    add("--mixed_precision", choices=("no", "fp16", "bf16"), help="else the launcher's choice")
    args = parser.parse_args(argv)
    for name in ("num_epochs", "batch_size", "image_size", "lr"):
        if not getattr(args, name) > 0:
            raise InputError(f"--{name} must be more than 0, got {getattr(args, name)}")
    if (args.num_workers or 0) < 0:
        raise InputError(f"--num_workers must be 0 or more, got {args.num_workers}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        train(parse_args(argv))
    except InputError as error:
        if os.environ.get("RANK", "0") == "0":  # every process finds it; the first one says it
            print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
