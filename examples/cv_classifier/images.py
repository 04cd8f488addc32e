"""Finding the images: the two folder layouts, a look at each file's header, the 80/20 split."""

from __future__ import annotations

import random
import re
from pathlib import Path

from .cli import InputError


IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}

IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")  # JPEG, PNG

PET_NAME = re.compile(r"^(?P<label>.+)_\d+$")  # applied to the file name without suffix

EVAL_FRACTION = 0.2


def is_image_name(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")


def folder_layout(subfolders: list[Path]) -> list[tuple[Path, str]]:
    """ImageFolder layout: every image below a sub-folder belongs to the sub-folder's class."""
    return [(path, folder.name) for folder in subfolders
            for path in sorted(folder.rglob("*")) if is_image_name(path) and path.is_file()]


def pet_layout(files: list[Path]) -> list[tuple[Path, str]]:
    """Oxford-IIIT Pet naming: the label is everything before the last `_number`."""
    matches = ((path, PET_NAME.match(path.stem)) for path in files if is_image_name(path))
    return [(path, match["label"]) for path, match in matches if match]


def has_image_header(path: Path) -> bool:
    """A cheap look at the first bytes: is this a JPEG or PNG at all? (No decoding.)"""
    try:
        with open(path, "rb") as file:
            head = file.read(8)
    except OSError:
        return False
    return head.startswith(IMAGE_MAGIC)


def find_images(data_dir: Path) -> tuple[list[tuple[Path, str]], list[Path]]:
    """(path, label) of every image in either layout, and the files skipped as non-images."""
    make_some = f"make a demo set with: python examples/make_demo_images.py {data_dir}"
    if not data_dir.exists():
        raise InputError(f"--data_dir {data_dir} does not exist; {make_some}")
    if not data_dir.is_dir():
        raise InputError(f"--data_dir {data_dir} is not a folder")
    entries = sorted(path for path in data_dir.iterdir() if not path.name.startswith("."))
    if not entries:
        raise InputError(f"--data_dir {data_dir} is empty; {make_some}")
    samples = folder_layout([path for path in entries if path.is_dir()])
    if not samples:
        samples = pet_layout([path for path in entries if path.is_file()])
    if not samples:
        raise InputError(
            f"no images in {data_dir} match either layout: files named Label_Name_123.jpg "
            "(Oxford-IIIT Pet) or one sub-folder of images per class (.jpg, .jpeg, .png)")
    readable, skipped = [], []
    for path, label in samples:
        if has_image_header(path):
            readable.append((path, label))
        else:
            skipped.append(path)
    classes = sorted({label for _, label in readable})
    if len(classes) < 2:
        found = f"only the class {classes[0]!r}" if classes else "no readable image"
        raise InputError(f"found {found} in {data_dir}; a classifier needs at least two classes")
    return readable, skipped


def check_batch_fits(num_train: int, batch_size: int, processes: int) -> None:
    """The last, smaller batch is dropped: a set smaller than a batch per process trains on
    nothing."""
    if num_train // batch_size < processes:
        raise InputError(f"--batch_size {batch_size} x {processes} process(es) is more than the "
                         f"{num_train} training images; use a smaller --batch_size or more images")


def split_train_eval(samples: list, seed: int) -> tuple[list, list]:
    """80/20, shuffled by the seed: the same seed always gives the same split."""
    shuffled = samples[:]
    random.Random(seed).shuffle(shuffled)
    n_eval = max(1, round(len(shuffled) * EVAL_FRACTION))
    return shuffled[n_eval:], shuffled[:n_eval]
