"""Train a torchvision image classifier on a folder of images, on the device the launcher picks.

    python examples/make_demo_images.py images      # real hand-written digits as JPEGs
    mpslaunch launch examples/cv_example.py --data_dir images --image_size 64
    python examples/cv_example.py --data_dir images --cpu          # without the launcher

Data (`--data_dir`). Either layout; files ending in .jpg, .jpeg or .png, in any case:
  * one folder of files named like the Oxford-IIIT Pet set, `Label_Name_123.jpg`: the label is
    everything before the last `_number` (`american_bulldog_12.jpg` is an "american_bulldog");
  * one sub-folder per class (torchvision's ImageFolder layout): `cat/001.jpg`, `dog/x.png`.
Hidden files (macOS `._*` copies) are ignored. Files whose first bytes are not a JPEG or PNG
header are skipped up front, with a warning; an image that still fails to decode (corrupt or
truncated) is skipped when it comes up, counted, and named in a warning at the end of the
epoch: it never stops training. The split is 80/20 train/eval, shuffled with `--seed`.

Model (`--model`, default resnet18): any torchvision classification model name (resnet50,
mobilenet_v3_small, ...), trained from scratch. `--pretrained` starts from torchvision's
ImageNet weights, only if they are already in torch's cache (torch.hub.get_dir()/checkpoints):
nothing is downloaded at run time; the error says how to fetch them once.

Device, precision, processes: whatever `Accelerator()` reads from the environment, which is
how `mpslaunch launch` passes its plan (ACCELERATE_USE_CPU, ACCELERATE_MIXED_PRECISION,
torchrun's variables for several processes). Run directly with python, `--cpu` and
`--mixed_precision no|fp16|bf16` are passed to Accelerator() (only when given).

Speed. Workers decode with torchvision.io and augment uint8 tensors with transforms.v2
(RandomResizedCrop, horizontal flip); batches travel as uint8 (4x less than float) and are
normalised on the device (nothing is done to the whole data set before the first step: files
are only listed and their first bytes read). DataLoader workers are persistent and prefetch; `--num_workers`
defaults to the CPUs available to this process less one, shared among the local processes
(none when training on the CPU, whose cores torch's own threads already use). Memory is
pinned only for CUDA; channels_last is used on CUDA and CPU (it slows convolutions' backward
on MPS); fused AdamW on CUDA. cuDNN autotuning (cudnn.benchmark) stays off: it searched for
seconds before the first step on an H200, for little gain on ResNets with cuDNN 9's
heuristics. Mixed precision is the launcher's choice (autocast through Accelerate).
`--decode gpu` (auto picks it on CUDA when the training JPEGs average 16 KB or more, i.e.
photos, not thumbnails): 4 workers only read the files and draw each image's crop and flip
(the same numbers the CPU path draws for the same seed); a thread of the training process
decodes each batch's JPEGs in one nvjpeg call and crops, resizes (roi_align, box-filtered:
pixel values within a few levels of the CPU path's) and flips them on the GPU, a few batches
ahead, on its own CUDA stream. PNGs and JPEGs nvjpeg refuses are decoded as before; eval
batches always decode in the workers. Measured on one H200 with 16 CPU cores, resnet18 fp32,
batch 64 (benchmarks/results/cv-throughput-h200-gpu-decode.log): Pet-sized 500x375 photos at
224 px trained at 3,452 images/s with gpu against 3,196 with cpu (pure step rate 7,024; last
epoch 0.66 against 0.53 of it; the pipeline alone 7,369 against 3,948 images/s), while the
64 px digits demo was slower with gpu (4,263 against 5,723), hence auto's size test. Neither
reaches the 0.85 of the step rate: the training loop itself is CPU-bound, and the decode thread
and the workers still take from the same cores. About 8 of the ~10 s before the first step there
are Python importing torch, torchvision (whose ops import torch._dynamo: 4 s) and Accelerate.

Progress: a tqdm bar on the main process with loss and images/s, the eval accuracy after each
epoch, and at the end `metrics.json` in `--output_dir`:
  eval_accuracy, eval_accuracy_per_epoch, epochs, global_step, train_images_per_second
  (images trained by all processes / seconds spent in training loops, waiting for data
  included, eval excluded, counted from the end of the first step, which is start-up; for a
  resumed run, only the part run now), the same for each epoch
  (train_images_per_second_per_epoch) and with the first step included
  (train_images_per_second_with_first_step), time_to_first_step_s (from the process start to
  the end of the first optimizer step), first_step_finished_at (Unix time), startup_s (seconds
  from the process start to each start-up phase), device, decode, cached_images,
  mixed_precision, num_processes, model, image_size, batch_size (per process), train_images,
  eval_images, skipped_images, seed.
and the trained weights as `model.safetensors`.

Checkpoints (Accelerate's save_state/load_state: model, optimizer, LR schedule, random states
and the position in training) go to `--output_dir/checkpoints/step_<global step>`:
`--checkpointing_steps epoch` after every epoch, `--checkpointing_steps N` every N steps.
SIGTERM or Ctrl-C: the current step finishes, a checkpoint is saved, and the script exits with
128 + the signal number (143 for SIGTERM, 130 for Ctrl-C; a second Ctrl-C aborts at once).
`--resume_from_checkpoint PATH|latest` continues at the same step (mid-epoch too), and ends
with the same weights as an uninterrupted run with the same seed: the shuffle order and every
image's augmentation depend only on (seed, epoch, image), never on which worker or process
loads it, and the random states are restored. `latest` with no checkpoint yet starts afresh.

Bad input (a missing, empty or unmatched --data_dir, a single class, a size <= 0, an unknown
model, a missing checkpoint) is one line on stderr, `cv_example: error: ...`, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import signal
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import torch
import torch.nn.functional as F
import torchvision
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, read_file
from torchvision.transforms import v2
from tqdm.auto import tqdm

PROG = "cv_example"
# JpegBatchDecoder pads a batch's images through a nested tensor, a stable use of a "prototype" API.
warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype")


class StartupClock:
    """Unix times of the start-up phases, reported in metrics.json as seconds since the
    process started: where the time before the first step goes."""

    def __init__(self):
        self.marks: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        self.marks.setdefault(phase, time.time())

    def since(self, start: float | None) -> dict[str, float]:
        return {phase: at - start for phase, at in self.marks.items()} if start else {}


STARTUP = StartupClock()
STARTUP.mark("imports_done")
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}
IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")  # JPEG, PNG
PET_NAME = re.compile(r"^(?P<label>.+)_\d+$")  # applied to the file name without suffix
EVAL_FRACTION = 0.2
AUTO_GPU_DECODE_BYTES = 16_000  # Pet-sized photos ~120 KB: gpu; 64 px digits ~2 KB: cpu
GPU_DECODE_WORKERS = 4  # default DataLoader workers per process with --decode gpu
UNREADABLE = -100  # label of an image that failed to decode; cross_entropy's ignore_index
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class InputError(Exception):
    """Bad input from the user: reported as one line and exit code 2."""


# ---------------------------------------------------------------- command line


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        raise InputError(message)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def checkpointing_steps(text: str) -> str | int:
    if text == "epoch":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'epoch' or a number of steps, got {text!r}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", required=True, type=Path,
                        help="folder of Label_Name_123.jpg files, or of one sub-folder per class")
    parser.add_argument("--output_dir", type=Path, default=Path("cv_example_output"),
                        help="where metrics.json, model.safetensors and checkpoints/ go")
    parser.add_argument("--model", default="resnet18", help="torchvision classification model")
    parser.add_argument("--pretrained", action="store_true",
                        help="start from torchvision's cached ImageNet weights (never downloads)")
    parser.add_argument("--num_epochs", type=positive_int, default=3)
    parser.add_argument("--batch_size", type=positive_int, default=64, help="per process")
    parser.add_argument("--image_size", type=positive_int, default=224)
    parser.add_argument("--lr", type=float, default=3e-3, help="peak of the one-cycle schedule")
    parser.add_argument("--num_workers", type=non_negative_int, default=None,
                        help="DataLoader workers per process (default: CPUs / local processes; "
                             "0 when training on the CPU)")
    parser.add_argument("--seed", type=int, default=42,
                        help="fixes the split, the initial weights, the order and augmentation")
    parser.add_argument("--checkpointing_steps", type=checkpointing_steps, default=None,
                        help="'epoch', or save every N steps")
    parser.add_argument("--resume_from_checkpoint", default=None,
                        help="a checkpoint folder, or 'latest' in --output_dir/checkpoints")
    parser.add_argument("--decode", choices=("auto", "cpu", "gpu"), default="auto",
                        help="where training JPEGs are decoded: 'gpu' (nvjpeg, in the training "
                             "process) or 'cpu' (DataLoader workers); auto: gpu on CUDA when "
                             "torchvision can decode there, else cpu")
    parser.add_argument("--image_cache_gb", type=non_negative_float, default=None,
                        help="with --decode gpu: keep up to this many GB of decoded training "
                             "images on the device, so later epochs skip reading and decoding "
                             "them (default: a quarter of the GPU's memory on CUDA; 0: off)")
    parser.add_argument("--cpu", action="store_true", help="Accelerator(cpu=True)")
    parser.add_argument("--mixed_precision", choices=("no", "fp16", "bf16"), default=None,
                        help="Accelerator(mixed_precision=...); default: the launcher's plan")
    args = parser.parse_args(argv)
    if not args.lr > 0:
        raise InputError(f"argument --lr: must be positive, got {args.lr}")
    return args


# ---------------------------------------------------------------- finding the images


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


# ---------------------------------------------------------------- data pipeline


@contextmanager
def seeded_rng(seed: int):
    """torch's CPU generator (which transforms.v2 draws from) seeded for one image.

    A DataLoader worker owns its generator, so seeding it is enough; in the training process
    (--num_workers 0) the generator's state is saved and restored around it. Only the CPU
    generator: seeding all (torch.manual_seed) would wake CUDA or MPS in every worker.
    """
    if get_worker_info() is not None:
        torch.random.default_generator.manual_seed(seed)
        yield
    else:
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)
            yield


class ImageFiles(Dataset):
    """Decodes one image file to a uint8 (3, H, W) tensor and transforms it.

    Items are requested as an index (eval: no randomness) or as (index, augmentation seed)
    (training: see EpochShuffle). Returns (image, label, index); an image that does not decode
    comes back blank with the label UNREADABLE, so a bad file costs one sample, never the epoch.
    """

    def __init__(self, samples: list[tuple[Path, int]], transform, image_size: int,
                 encoded: bool = False, cached_sizes: torch.Tensor | None = None):
        self.paths = [str(path) for path, _ in samples]
        self.labels = [label for _, label in samples]
        self.transform = transform
        self.image_size = image_size
        # --decode gpu: training JPEGs are not decoded here but read and given their crop and
        # flip (EncodedImage); the training process decodes them (JpegBatchDecoder).
        self.encoded = encoded
        # (height, width) of the images the training process holds decoded (DecodedImageCache),
        # 0 for the others: in shared memory, so the workers see it fill up.
        self.cached_sizes = cached_sizes

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, item):
        index, seed = item if isinstance(item, tuple) else (item, None)
        if self.encoded and seed is not None:
            encoded = self.read_encoded(index, seed)
            if encoded is not None:
                return encoded, self.labels[index], index
        try:
            image = decode_image(read_file(self.paths[index]), mode=ImageReadMode.RGB)
        except (RuntimeError, OSError, ValueError):
            return self.blank(), UNREADABLE, index
        if image.dtype != torch.uint8:  # 16-bit PNG
            image = v2.functional.to_dtype(image, torch.uint8, scale=True)
        if seed is None:
            return self.transform(image), self.labels[index], index
        with seeded_rng(seed):
            return self.transform(image), self.labels[index], index

    def blank(self) -> torch.Tensor:
        return torch.zeros(3, self.image_size, self.image_size, dtype=torch.uint8)

    def read_encoded(self, index: int, seed: int) -> EncodedImage | None:
        """The file's bytes and the crop and flip the CPU path would give it, or None for
        anything but a JPEG whose size the header tells (decoded here then, as before).
        An image the training process already holds decoded is not read: no bytes, only its
        crop and flip."""
        data, size = b"", self.cached_size(index)
        if size is None:
            try:
                with open(self.paths[index], "rb") as file:
                    data = file.read()
            except OSError:
                return None
            size = jpeg_size(data)
            if size is None:
                return None
        with seeded_rng(seed):
            box, flip = augmentation_params(self.transform, *size)
        return EncodedImage(data, size, box, flip)

    def cached_size(self, index: int) -> tuple[int, int] | None:
        if self.cached_sizes is None:
            return None
        height, width = self.cached_sizes[index].tolist()
        # Both set, or the training process is still writing them: read the file this time.
        return (height, width) if height and width else None


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from a JPEG's frame header (SOFn), or None: no decoding, a few µs."""
    if not data.startswith(b"\xff\xd8"):
        return None
    at, end = 2, len(data)
    while at + 4 <= end:
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # no length field
            at += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header before
            return None
        length = int.from_bytes(data[at + 2:at + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if at + 9 > end:
                return None
            height = int.from_bytes(data[at + 5:at + 7], "big")
            width = int.from_bytes(data[at + 7:at + 9], "big")
            return (height, width) if height > 0 and width > 0 else None
        at += 2 + length
    return None


def augmentation_params(transform: v2.Compose, height: int, width: int):
    """The crop (top, left, height, width) and flip that train_transform draws for an image of
    this size, from torch's CPU generator, in the same order: the same numbers for the same seed.
    """
    crop, flip = transform.transforms
    shape = torch.empty((), dtype=torch.uint8).expand(3, height, width)  # no memory
    make_params = getattr(crop, "make_params", None) or crop._get_params  # torchvision < 0.21
    params = make_params([shape])
    box = (params["top"], params["left"], params["height"], params["width"])
    return box, bool(torch.rand(1) < flip.p)  # RandomHorizontalFlip: no flip if rand >= p


class EncodedImage:
    """A training JPEG not decoded yet: its bytes (none when the training process holds it
    decoded already), size, crop box and flip."""

    __slots__ = ("data", "size", "box", "flip")

    def __init__(self, data: bytes, size: tuple[int, int], box: tuple, flip: bool):
        self.data, self.size, self.box, self.flip = data, size, box, flip


class EncodedBatch:
    """A training batch as the workers send it with --decode gpu.

    data: the JPEGs' bytes end to end (one shared-memory block, not one per image), split by
    sizes (0: held in the DecodedImageCache); jpeg_indices: their data set indices; meta: float (jpegs, 8): slot, left, top, right, bottom (roi_align's box), height,
    width, flip; ready: images the workers decoded themselves (PNGs, unusual JPEGs, unreadable
    ones), already transformed, at ready_positions in the batch.
    """

    def __init__(self, items: list, indices: list[int]):
        jpegs = [(pos, item) for pos, item in enumerate(items) if isinstance(item, EncodedImage)]
        self.count = len(items)
        self.jpeg_positions = [pos for pos, _ in jpegs]
        self.jpeg_indices = [indices[pos] for pos, _ in jpegs]
        self.ready_positions = [pos for pos, item in enumerate(items)
                                if not isinstance(item, EncodedImage)]
        self.sizes = [len(item.data) for _, item in jpegs]
        self.data = torch.empty(sum(self.sizes), dtype=torch.uint8)
        if get_worker_info() is not None:  # filled in place: no copy when it is sent
            self.data.share_memory_()
        buffer, at = self.data.numpy(), 0
        for _, item in jpegs:
            buffer[at:at + len(item.data)] = memoryview(item.data)
            at += len(item.data)
        self.meta = torch.tensor(
            [(slot, left, top, left + w, top + h, *item.size, item.flip)
             for slot, (_, item) in enumerate(jpegs) for top, left, h, w in [item.box]],
            dtype=torch.float32).view(-1, 8)
        self.ready = (torch.stack([items[pos] for pos in self.ready_positions])
                      if self.ready_positions else None)

    def pin_memory(self) -> EncodedBatch:
        """DataLoader(pin_memory=True) calls this: what is copied to the device gets pinned
        (the bytes are read by nvjpeg on the host)."""
        self.meta = self.meta.pin_memory()
        if self.ready is not None:
            self.ready = self.ready.pin_memory()
        return self


def collate_encoded(batch: list) -> tuple[EncodedBatch, torch.Tensor, torch.Tensor]:
    items, labels, indices = zip(*batch)
    return EncodedBatch(list(items), list(indices)), torch.tensor(labels), torch.tensor(indices)


class DecodedImageCache:
    """Training images kept decoded on the device, so later epochs neither read nor decode them.

    Kept at full resolution, exactly as decoded: a crop from the cache is the crop of a fresh
    decode, bit for bit, so a resumed run (which starts with an empty cache) still ends with
    the weights of an uninterrupted one. Images are added until `budget_bytes` is used (never
    evicted); `sizes` (shared memory, filled last) tells the DataLoader workers which images
    not to read any more.
    """

    def __init__(self, count: int, budget_bytes: int):
        self.sizes = torch.zeros((count, 2), dtype=torch.int32).share_memory_()
        self.images: dict[int, torch.Tensor] = {}
        self.budget_bytes, self.used_bytes = budget_bytes, 0

    def get(self, index: int) -> torch.Tensor | None:
        return self.images.get(index)

    def add(self, indices: list[int], images: list[torch.Tensor]) -> None:
        added = []
        for index, image in zip(indices, images):
            if index in self.images or self.used_bytes + image.numel() > self.budget_bytes:
                continue
            if image.untyped_storage().nbytes() != image.numel():  # a view pins its whole base
                image = image.clone()
            self.images[index] = image
            self.used_bytes += image.numel()
            added.append((index, *image.shape[1:]))
        if added:  # workers take an image as cached once both its sizes are set: height last
            index, heights, widths = torch.tensor(added, dtype=torch.int64).unbind(1)
            self.sizes[index, 1] = widths.int()
            self.sizes[index, 0] = heights.int()


class JpegBatchDecoder:
    """EncodedBatch -> uint8 (N, 3, S, S) on the device, as train_transform would give it.

    All the JPEGs of a batch are decoded in one call (nvjpeg batches them; baseline JPEGs go to
    the GPU's hardware decoder); each is copied to the top left of a canvas whose last row and
    column are repeated one pixel further (so sampling at an image's edge sees the edge, as
    interpolate's clamping does); roi_align then crops and resizes all of them in one kernel,
    averaging ceil(crop / S) x ceil(crop / S) bilinear samples per output pixel (a box filter
    against aliasing, where the CPU path uses antialiased bilinear resizing: the same crop and
    flip, pixel values within a few levels). A batch call that raises is retried image by image,
    then on the CPU; an image nothing decodes comes back blank and is returned in `failed`.
    """

    def __init__(self, device: torch.device, image_size: int,
                 cache: DecodedImageCache | None = None):
        self.device, self.size, self.cache = device, image_size, cache
        self.nothing = torch.zeros((3, 1, 1), dtype=torch.uint8, device=device)

    def decode(self, encoded: list[torch.Tensor]) -> list[torch.Tensor | None]:
        try:
            return decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            return [self.decode_one(data) for data in encoded]

    def decode_one(self, data: torch.Tensor) -> torch.Tensor | None:
        try:
            return decode_jpeg([data], mode=ImageReadMode.RGB, device=self.device)[0]
        except RuntimeError:
            pass
        try:  # CMYK, 12-bit, ...: what nvjpeg refuses may still decode on the CPU
            image = decode_image(data, mode=ImageReadMode.RGB)
        except (RuntimeError, ValueError):
            return None
        if image.dtype != torch.uint8:
            image = v2.functional.to_dtype(image, torch.uint8, scale=True)
        return image.to(self.device)

    def decode_or_recall(self, batch: EncodedBatch,
                         sizes: list[tuple[int, int]]) -> list[torch.Tensor | None]:
        """Each JPEG of the batch decoded: from the cache when the worker sent no bytes, else
        decoded now (all in one call) and offered to the cache."""
        encoded = torch.split(batch.data, batch.sizes)
        fresh = [slot for slot, size in enumerate(batch.sizes) if size]
        images = [None if size else self.cache.get(batch.jpeg_indices[slot])
                  for slot, size in enumerate(batch.sizes)]
        decoded = self.decode([encoded[slot] for slot in fresh]) if fresh else []
        for slot, image in zip(fresh, decoded):
            images[slot] = image
        if self.cache is not None:
            whole = [slot for slot, image in zip(fresh, decoded)
                     if image is not None and image.shape[1:] == sizes[slot]]
            self.cache.add([batch.jpeg_indices[slot] for slot in whole],
                           [images[slot] for slot in whole])
        return images

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, list[int]]:
        size, device = self.size, self.device
        failed = []
        if not batch.jpeg_positions:
            return batch.ready.to(device, non_blocking=True), failed
        meta = batch.meta.to(device, non_blocking=True)
        heights, widths = batch.meta[:, 5].long().tolist(), batch.meta[:, 6].long().tolist()
        images = self.decode_or_recall(batch, list(zip(heights, widths)))
        count = len(images)
        for slot, (image, height, width) in enumerate(zip(images, heights, widths)):
            if image is None or image.shape[1:] != (height, width):
                failed.append(batch.jpeg_positions[slot])
                images[slot] = self.nothing  # its crop is blanked below
        # Each image at the top left of its slot, zeros around: one call, not a copy per
        # image (their Python would compete with the training loop's for the interpreter).
        canvas = torch.nested.as_nested_tensor(images).to_padded_tensor(
            0, output_size=(count, 3, max(heights) + 1, max(widths) + 1))
        extent = meta[:, 5:7].long().view(count, 2, 1, 1, 1)
        _, _, rows, cols = canvas.shape
        edge = (extent[:, 1] - 1).expand(count, 3, rows, 1)  # the last column, one further
        canvas.scatter_(3, edge + 1, canvas.gather(3, edge))
        edge = (extent[:, 0] - 1).expand(count, 3, 1, cols)  # the last row, one further
        canvas.scatter_(2, edge + 1, canvas.gather(2, edge))
        crops = torchvision.ops.roi_align(canvas.float(), meta[:, :5], output_size=size, spatial_scale=1.0,
                          sampling_ratio=-1, aligned=True)
        crops = torch.where(meta[:, 7].bool().view(count, 1, 1, 1), crops.flip(3), crops)
        crops = crops.add_(0.5).to(torch.uint8)  # round: values are within 0..255
        if batch.ready is None:
            images = crops
        else:
            images = torch.empty((batch.count, 3, size, size), dtype=torch.uint8, device=device)
            images[batch.jpeg_positions] = crops
            images[batch.ready_positions] = batch.ready.to(device, non_blocking=True)
        if failed:
            images[failed] = 0
        return images, failed


class DecodeAhead:
    """Runs the training loader and the JpegBatchDecoder in a thread, a few batches ahead.

    nvjpeg's batch call waits for the decoder (~3 ms a batch of 64 photos on the H200), and the
    crop launches cost ~1 ms more: done in the training loop they added to its (CPU-bound) step.
    The thread works on its own CUDA stream; the training stream waits for each batch's event
    and record_stream keeps the memory until the training stream is done with it. Torch ops
    release the GIL while they run, so the two threads mostly overlap.
    """

    DONE = object()

    def __init__(self, loader, prepare, device: torch.device, stream=None, depth: int = 3):
        self.loader, self.prepare, self.device, self.depth = loader, prepare, device, depth
        self.stream = stream  # CUDA: the same stream every epoch (the cache's images live on it)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        batches: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        cuda = self.device.type == "cuda"
        stream = self.stream if self.stream is not None or not cuda else torch.cuda.Stream(
            self.device)

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    batches.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    pass
            return False

        def work() -> None:
            try:
                with torch.cuda.stream(stream) if cuda else contextmanager(lambda: (yield))():
                    for images, labels, indices in self.loader:
                        images, labels = self.prepare(images, labels)
                        event = torch.cuda.Event() if cuda else None
                        if cuda:
                            event.record(stream)
                        if not put((images, labels, indices, event)):
                            return
            except BaseException as error:  # noqa: BLE001 - raised again in the training loop
                put(error)
                return
            put(self.DONE)

        thread = threading.Thread(target=work, name="decode-ahead", daemon=True)
        thread.start()
        try:
            while True:
                item = batches.get()
                if item is self.DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                images, labels, indices, event = item
                if cuda:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event)
                    for tensor in (images, labels, indices):
                        tensor.record_stream(current)
                yield images, labels, indices
        finally:
            stop.set()
            thread.join()


def make_image_cache(count: int, gigabytes: float | None,
                     device: torch.device) -> DecodedImageCache | None:
    """--image_cache_gb; by default a quarter of a CUDA device's memory (the H200's 140 GB
    hold the Oxford-IIIT Pet photos decoded many times over; most GPUs hold them too)."""
    if gigabytes is None:
        if device.type != "cuda":
            return None
        budget = torch.cuda.get_device_properties(device).total_memory // 4
    else:
        budget = int(gigabytes * 1e9)
    return DecodedImageCache(count, budget) if budget > 0 else None


def mean_file_size(paths: list[str]) -> float:
    sizes = []
    for path in paths:
        try:
            sizes.append(os.path.getsize(path))
        except OSError:
            pass
    return sum(sizes) / len(sizes) if sizes else 0.0


def gpu_decode_available(device: torch.device) -> bool:
    """Whether torchvision decodes JPEGs on this device (built with nvjpeg, and it works)."""
    if device.type != "cuda":
        return False
    try:
        probe = torchvision.io.encode_jpeg(torch.zeros(3, 16, 16, dtype=torch.uint8))
        decode_jpeg([probe], device=device)
    except (RuntimeError, AttributeError, TypeError):
        return False
    return True


def choose_decode(choice: str, device: torch.device, paths: list[str]) -> str:
    """--decode: 'gpu' or 'cpu'. auto: gpu on CUDA for photo-sized JPEGs only (the first 64
    training files average AUTO_GPU_DECODE_BYTES or more); small images decode faster in the
    workers (measured on an H200: see Speed in the module docstring)."""
    if choice == "cpu" or (choice == "auto" and device.type != "cuda"):
        return "cpu"
    if choice == "auto" and mean_file_size(paths[:64]) < AUTO_GPU_DECODE_BYTES:
        return "cpu"
    if gpu_decode_available(device):
        return "gpu"
    if choice == "gpu":
        raise InputError(f"--decode gpu: torchvision cannot decode JPEGs on {device.type} here "
                         "(it needs CUDA and torchvision built with nvjpeg); use --decode cpu")
    return "cpu"


class EpochShuffle(Sampler):
    """Yields (index, augmentation seed) pairs in a fresh order each epoch.

    Both come from a generator seeded by (seed, epoch) alone, so the crops and flips an image
    gets do not depend on which worker or process decodes it, nor on where a resumed run
    starts: an interrupted-then-resumed run sees exactly the batches of an uninterrupted one.
    Accelerate calls set_epoch on the samplers it finds.
    """

    def __init__(self, size: int, seed: int):
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        seeds = torch.randint(2**62, (self.size,), generator=generator).tolist()
        return iter(zip(order, seeds))


def train_transform(image_size: int):
    # scale >= 0.35 rather than 0.08: small data sets and small images keep their subject.
    return v2.Compose([v2.RandomResizedCrop(image_size, scale=(0.35, 1.0), antialias=True),
                       v2.RandomHorizontalFlip()])


def eval_transform(image_size: int):
    return v2.Compose([v2.Resize(round(image_size / 0.875), antialias=True),
                       v2.CenterCrop(image_size)])


def ignore_interrupts(_worker_id: int) -> None:
    """Workers leave SIGINT/SIGTERM to the main process, which finishes the step and saves."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def default_num_workers(device: torch.device) -> int:
    """All the CPUs for an accelerator; none when the CPU itself trains.

    Training on the CPU, torch's threads already use every core: a worker would fight them for
    cores (OpenMP's waiting threads make that cost far more than the work moved), while decoding
    in the training process costs about 1-2% of a CPU step. Measured on 2 cores: 0 workers
    trained the demo 20-30% faster than 1.
    """
    if device.type == "cpu":
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    # One core per process stays free for the training loop itself (and its pin-memory thread).
    return max(1, (cpus or 1) // local_processes - 1)


def make_loader(dataset: Dataset, batch_size: int, num_workers: int, pin_memory: bool, *,
                sampler: Sampler | None = None, drop_last: bool = False,
                collate_fn=None) -> DataLoader:
    workers = {}
    if num_workers > 0:
        # About 8 batches in flight in all: enough to absorb slow images, without filling
        # shared memory when there are many workers.
        workers = dict(persistent_workers=True, prefetch_factor=max(2, 8 // num_workers),
                       worker_init_fn=ignore_interrupts)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                      num_workers=num_workers, pin_memory=pin_memory, collate_fn=collate_fn,
                      # Its own generator: creating iterators must not draw from the
                      # training RNG, or a resumed run would drift from an uninterrupted one.
                      generator=torch.Generator(), **workers)


# ---------------------------------------------------------------- model


def cached_weights_file(weights) -> Path:
    """Where torchvision's loader looks before downloading (load_state_dict_from_url)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(weights.url).path)


def replace_classifier(model: torch.nn.Module, num_classes: int, name: str) -> None:
    linears = [(path, m) for path, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        raise InputError(f"--pretrained with {name}: no nn.Linear classifier to replace; "
                         "train it from scratch (leave out --pretrained)")
    path, last = linears[-1]
    model.set_submodule(path, torch.nn.Linear(last.in_features, num_classes))


def check_model_choice(name: str, pretrained: bool) -> None:
    """A known classification model, and its weights in the cache when --pretrained."""
    if name not in torchvision.models.list_models(module=torchvision.models):
        raise InputError(f"unknown --model {name!r}; use a torchvision classification model, "
                         "e.g. resnet18, resnet50, mobilenet_v3_small, efficientnet_b0")
    if pretrained:
        cached = cached_weights_file(torchvision.models.get_model_weights(name).DEFAULT)
        if not cached.is_file():
            raise InputError(
                f"--pretrained: torchvision's {name} weights are not cached ({cached} is "
                "missing) and nothing is downloaded at run time; fetch them once with: python -c "
                f"\"import torchvision; torchvision.models.get_model('{name}', weights='DEFAULT')\"")


def build_model(name: str, num_classes: int, pretrained: bool) -> torch.nn.Module:
    check_model_choice(name, pretrained)
    if not pretrained:
        return torchvision.models.get_model(name, num_classes=num_classes)
    model = torchvision.models.get_model(name, weights="DEFAULT")  # read from the cache
    replace_classifier(model, num_classes, name)
    return model


def make_optimizer(model: torch.nn.Module, peak_lr: float, total_steps: int,
                   device: torch.device):
    """AdamW on a one-cycle schedule: warm up to peak_lr, then anneal.

    On CUDA the fused AdamW kernel updates all parameters at once instead of a few kernels per
    tensor (the other devices keep torch's default implementation).
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr / 25,
                                  fused=True if device.type == "cuda" else None)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=peak_lr,
                                                    total_steps=total_steps)
    return optimizer, scheduler


def memory_format_for(device: torch.device) -> torch.memory_format:
    # channels_last speeds convolutions up with cuDNN and oneDNN; on MPS its backward is slow.
    return torch.contiguous_format if device.type == "mps" else torch.channels_last


class Normalizer:
    """uint8 batch on the device -> normalised float batch in the model's memory format."""

    def __init__(self, device: torch.device, memory_format: torch.memory_format):
        shape = (1, 3, 1, 1)
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).mul(255).view(shape)
        self.std = torch.tensor(IMAGENET_STD, device=device).mul(255).view(shape)
        self.memory_format = memory_format

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        images = images.contiguous(memory_format=self.memory_format)
        return images.float().sub_(self.mean).div_(self.std)


def train_step(accelerator, model, optimizer, scheduler, normalize, images, labels):
    """One optimizer step; returns the loss, still on the device (reading it would sync)."""
    logits = model(normalize(images))
    # Sum over readable images / their count: a batch of only unreadable ones gives 0, not NaN.
    readable = (labels != UNREADABLE).sum().clamp_min(1)
    loss = F.cross_entropy(logits, labels, ignore_index=UNREADABLE, reduction="sum") / readable
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


@torch.no_grad()
def evaluate(accelerator, model, normalize, loader) -> tuple[float, torch.Tensor]:
    """Accuracy over the readable eval images, and the indices of the unreadable ones."""
    model.eval()
    correct = torch.zeros((), device=accelerator.device, dtype=torch.long)
    total = torch.zeros_like(correct)
    unreadable = []  # per batch: the index of each unreadable image, -1 for the others
    for images, labels, indices in loader:
        predictions = model(normalize(images)).argmax(dim=1)
        predictions, labels, indices = accelerator.gather_for_metrics(
            (predictions, labels, indices))
        readable = labels != UNREADABLE
        correct += (predictions.eq(labels) & readable).sum()
        total += readable.sum()
        unreadable.append(torch.where(readable, -1, indices))
    model.train()
    unreadable = torch.cat(unreadable)
    return correct.item() / max(1, total.item()), unreadable[unreadable >= 0]


# ---------------------------------------------------------------- checkpoints and signals


class TrainingPosition:
    """Where training is; saved with each checkpoint (Accelerate's register_for_checkpointing)."""

    def __init__(self):
        self.epoch = 0            # epochs completed
        self.step_in_epoch = 0    # optimizer steps done in the current epoch
        self.global_step = 0
        self.eval_accuracies: list[float] = []

    def state_dict(self) -> dict:
        return dict(epoch=self.epoch, step_in_epoch=self.step_in_epoch,
                    global_step=self.global_step, eval_accuracies=list(self.eval_accuracies))

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.step_in_epoch = state["epoch"], state["step_in_epoch"]
        self.global_step, self.eval_accuracies = state["global_step"], state["eval_accuracies"]


CHECKPOINT_NAME = re.compile(r"^step_(\d+)$")


def checkpoint_dir(output_dir: Path, global_step: int) -> Path:
    return output_dir / "checkpoints" / f"step_{global_step:08d}"


def latest_checkpoint(output_dir: Path) -> Path | None:
    folder = output_dir / "checkpoints"
    found = [p for p in folder.iterdir() if CHECKPOINT_NAME.match(p.name)] if folder.is_dir() else []
    return max(found, key=lambda p: int(CHECKPOINT_NAME.match(p.name)[1]), default=None)


def checkpoint_to_resume(args) -> Path | None:
    if args.resume_from_checkpoint is None:
        return None
    if args.resume_from_checkpoint == "latest":
        return latest_checkpoint(args.output_dir)
    path = Path(args.resume_from_checkpoint)
    if not path.is_dir():
        raise InputError(f"--resume_from_checkpoint {path}: no such checkpoint folder")
    return path


def write_replacing(path: Path, text: str) -> None:
    """Write beside `path`, then rename over it: a crash never leaves half a file, and a symlink
    planted at `path` is replaced, never followed. The file gets the user's umask."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(descriptor, "w") as stream:
        stream.write(text)
    os.replace(temporary, path)


def save_model_replacing(accelerator, model, output_dir: Path) -> None:
    """Accelerate's save_model into a fresh folder, then each file renamed into output_dir
    (same reason as write_replacing)."""
    staging = output_dir / f".model.{os.getpid()}.tmp"
    staging.mkdir()
    try:
        accelerator.save_model(model, str(staging))
        for saved in staging.iterdir():
            os.replace(saved, output_dir / saved.name)
    finally:
        for left in staging.iterdir():
            left.unlink()
        staging.rmdir()


def save_checkpoint(accelerator, output_dir: Path, global_step: int) -> Path:
    """save_state into step_N.partial, then rename: a killed save never looks complete."""
    final = checkpoint_dir(output_dir, global_step)
    if final.exists():  # e.g. the step checkpoint was just written and then a signal came
        return final
    partial = final.with_name(final.name + ".partial")
    accelerator.save_state(str(partial))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        partial.rename(final)
    accelerator.wait_for_everyone()
    return final


class StopRequest:
    """SIGTERM/SIGINT set a flag; the training loop finishes its step, saves and exits."""

    def __init__(self):
        self.signal_number: int | None = None

    def install(self) -> None:
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signal_number, self._handle)

    def _handle(self, signal_number, _frame) -> None:
        if self.signal_number == signal.SIGINT and signal_number == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
        self.signal_number = signal_number

    def agreed(self, accelerator) -> bool:
        """Whether to stop now; with several processes, all of them stop at the same step."""
        if accelerator.num_processes == 1:
            return self.signal_number is not None
        if self.signal_number is not None:
            accelerator.set_trigger()
        return accelerator.check_trigger()

    def exit_code(self) -> int:
        return 128 + (self.signal_number or signal.SIGTERM)


# ---------------------------------------------------------------- training


def make_accelerator(args) -> Accelerator:
    options = {}
    if args.cpu:
        options["cpu"] = True
    if args.mixed_precision is not None:
        options["mixed_precision"] = args.mixed_precision
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(), **options)
    # Asynchronous host->device copies pay off from pinned memory, which only CUDA uses.
    accelerator.dataloader_config.non_blocking = accelerator.device.type == "cuda"
    return accelerator


def warn(accelerator, message: str) -> None:
    if accelerator is None or accelerator.is_main_process:
        tqdm.write(f"{PROG}: warning: {message}", file=sys.stderr)


def describe_paths(paths: list) -> str:
    names = ", ".join(str(p) for p in paths[:3])
    return names + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


class Trainer:
    """Holds what the training loop needs; one method per phase."""

    def __init__(self, args, accelerator, samples, skipped_files):
        self.args, self.accelerator = args, accelerator
        self.device = accelerator.device
        self.skipped_files = list(skipped_files)
        self.undecodable_files: set[str] = set()
        train_loader, eval_loader = self.make_loaders(samples)
        set_seed(args.seed)
        model = build_model(args.model, self.num_classes, args.pretrained)
        self.memory_format = memory_format_for(self.device)
        model = model.to(memory_format=self.memory_format)
        # Counted in global steps before prepare(); Accelerate steps the schedule once per
        # process at each step, so it ends on time with any number of processes.
        optimizer, scheduler = make_optimizer(model, args.lr,
                                              args.num_epochs * len(train_loader), self.device)
        (self.model, self.optimizer, self.scheduler, self.train_loader,
         self.eval_loader) = accelerator.prepare(model, optimizer, scheduler, train_loader,
                                                 eval_loader)
        self.normalize = Normalizer(self.device, self.memory_format)
        self.position = TrainingPosition()
        accelerator.register_for_checkpointing(self.position)
        self.stop = StopRequest()
        self.train_seconds = 0.0
        self.images_trained = 0
        self.epoch_rates: list[float] = []  # images/s of each epoch run in this process
        self.first_step_finished_at: float | None = None
        self.first_step = (0.0, 0)  # (seconds from the epoch's start, images) when run here

    def make_loaders(self, samples) -> tuple[DataLoader, DataLoader]:
        args = self.args
        classes = sorted({label for _, label in samples})
        class_index = {label: i for i, label in enumerate(classes)}
        self.num_classes = len(classes)
        train, evals = split_train_eval([(p, class_index[label]) for p, label in samples],
                                        args.seed)
        self.decode = choose_decode(args.decode, self.device, [str(p) for p, _ in train])
        gpu_decode = self.decode == "gpu"
        self.image_cache = make_image_cache(len(train), args.image_cache_gb, self.device) \
            if gpu_decode else None
        self.jpeg_decoder = JpegBatchDecoder(self.device, args.image_size, self.image_cache) \
            if gpu_decode else None
        self.decode_stream = torch.cuda.Stream(self.device) \
            if gpu_decode and self.device.type == "cuda" else None
        self.train_set = ImageFiles(
            train, train_transform(args.image_size), args.image_size, encoded=gpu_decode,
            cached_sizes=self.image_cache.sizes if self.image_cache is not None else None)
        self.eval_set = ImageFiles(evals, eval_transform(args.image_size), args.image_size)
        self.sampler = EpochShuffle(len(self.train_set), args.seed)
        workers = args.num_workers
        if workers is None:
            workers = default_num_workers(self.device)
        # Reading files and drawing crops is little work: a few workers keep up, and the cores
        # stay free for the training loop, which now decodes too.
        train_workers = min(workers, GPU_DECODE_WORKERS) if gpu_decode and \
            args.num_workers is None else workers
        pin = self.device.type == "cuda"
        # drop_last: every training batch has one shape, and BatchNorm never gets a batch of 1.
        train_loader = make_loader(self.train_set, args.batch_size, train_workers, pin,
                                   sampler=self.sampler, drop_last=True,
                                   collate_fn=collate_encoded if gpu_decode else None)
        return train_loader, make_loader(self.eval_set, args.batch_size, workers, pin)

    def training_batches(self, loader):
        """The loader's batches as images on the device (--decode gpu: decoded ahead)."""
        if self.jpeg_decoder is None:
            return loader
        return DecodeAhead(loader, self.prepare_batch, self.device, self.decode_stream)

    def prepare_batch(self, images, labels) -> tuple[torch.Tensor, torch.Tensor]:
        """--decode gpu: an EncodedBatch becomes images on the device; images that did not
        decode are blank and labelled UNREADABLE."""
        if self.jpeg_decoder is None:
            return images, labels
        images, failed = self.jpeg_decoder(images)
        if failed:
            labels = labels.clone()
            labels[failed] = UNREADABLE
        return images, labels

    # -- phases

    def resume(self) -> None:
        checkpoint = checkpoint_to_resume(self.args)
        if checkpoint is None:
            if self.args.resume_from_checkpoint == "latest":
                warn(self.accelerator, f"no checkpoint in {self.args.output_dir / 'checkpoints'}"
                     "; starting from the beginning")
            return
        try:
            self.accelerator.load_state(str(checkpoint))
        except (RuntimeError, ValueError, KeyError, FileNotFoundError) as error:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise InputError(f"cannot resume from {checkpoint}: it does not match this run "
                             f"(model, classes or options): {first_line}") from None
        self.accelerator.print(f"{PROG}: resumed from {checkpoint} at epoch "
                               f"{self.position.epoch + 1}, step {self.position.global_step}")

    def run(self) -> int:
        """Train all epochs; returns the exit code (0, or 128+N after a stop signal)."""
        self.stop.install()
        for epoch in range(self.position.epoch, self.args.num_epochs):
            if not self.train_one_epoch(epoch):
                return self.save_and_stop()
            self.position.epoch, self.position.step_in_epoch = epoch + 1, 0
            self.evaluate_epoch(epoch)
            if self.args.checkpointing_steps == "epoch":
                save_checkpoint(self.accelerator, self.args.output_dir, self.position.global_step)
            if self.stop.agreed(self.accelerator):
                return self.save_and_stop()
        self.finish()
        return 0

    def announce(self) -> None:
        a = self.accelerator
        a.print(f"{PROG}: {len(self.train_set)} train / {len(self.eval_set)} eval images, "
                f"{self.num_classes} classes; {self.args.model} on {self.device.type} "
                f"(mixed precision {a.mixed_precision}, {a.num_processes} process(es), "
                f"batch {self.args.batch_size} per process, JPEGs decoded on the {self.decode})")
        if self.skipped_files:
            warn(a, f"skipped {len(self.skipped_files)} file(s) that are not JPEG or PNG images: "
                    f"{describe_paths(self.skipped_files)}")

    def train_one_epoch(self, epoch: int) -> bool:
        """False when a stop signal came (the position then points after the last step done)."""
        a, args = self.accelerator, self.args
        self.sampler.set_epoch(epoch)
        self.train_loader.set_epoch(epoch)
        steps = len(self.train_loader)
        loader = self.train_loader
        if self.position.step_in_epoch:
            loader = a.skip_first_batches(self.train_loader, self.position.step_in_epoch)
        bar = tqdm(total=steps, initial=self.position.step_in_epoch, disable=not a.is_main_process,
                   desc=f"epoch {epoch + 1}/{args.num_epochs}", unit="step", dynamic_ncols=True)
        unreadable = torch.zeros(len(self.train_set), dtype=torch.bool, device=self.device)
        started, images, loss, shown_at = time.perf_counter(), 0, None, 0.0
        stopped = False
        for batch_images, labels, indices in self.training_batches(loader):
            STARTUP.mark("first_batch_on_device")
            loss = train_step(a, self.model, self.optimizer, self.scheduler, self.normalize,
                              batch_images, labels)
            unreadable[indices] = labels == UNREADABLE  # no host sync
            images += batch_images.shape[0] * a.num_processes
            self.position.step_in_epoch += 1
            self.position.global_step += 1
            if self.first_step_finished_at is None:
                loss.item()  # wait for the device, so the time is honest
                self.first_step_finished_at = time.time()
                STARTUP.mark("first_step_done")
                # The first step is start-up (loading kernels, choosing algorithms, the first
                # batch): reported as time_to_first_step_s, the rates count from its end.
                self.first_step = (time.perf_counter() - started, images)
                started, images = time.perf_counter(), 0
            bar.update(1)
            if time.perf_counter() - shown_at > 1.0:  # reading the loss syncs: not every step
                shown_at = time.perf_counter()
                bar.set_postfix(loss=f"{loss.item():.3f}",
                                img_s=f"{images / (shown_at - started):,.0f}")
            if self.step_checkpoint_due():
                save_checkpoint(a, args.output_dir, self.position.global_step)
            if self.stop.agreed(a):
                stopped = True
                break
        if loss is not None:
            loss.item()
        seconds = time.perf_counter() - started
        self.train_seconds += seconds
        self.images_trained += images
        self.epoch_rates.append(images / seconds)
        bar.close()
        self.report_unreadable(self.train_set, unreadable, "training")
        return not stopped

    def step_checkpoint_due(self) -> bool:
        every = self.args.checkpointing_steps
        return isinstance(every, int) and self.position.global_step % every == 0

    def evaluate_epoch(self, epoch: int) -> None:
        accuracy, unreadable = evaluate(self.accelerator, self.model, self.normalize,
                                        self.eval_loader)
        self.position.eval_accuracies.append(accuracy)
        if len(unreadable):
            self.warn_unreadable(self.eval_set, unreadable.tolist(), "eval")
        rate = self.images_trained / max(self.train_seconds, 1e-9)
        self.accelerator.print(f"{PROG}: epoch {epoch + 1}: eval accuracy {accuracy:.4f} "
                               f"(training {rate:,.0f} images/s so far)")

    def report_unreadable(self, dataset, unreadable: torch.Tensor, where: str) -> None:
        unreadable = self.accelerator.reduce(unreadable.int(), reduction="sum")
        indices = unreadable.nonzero().flatten().tolist()
        if indices:
            self.warn_unreadable(dataset, indices, where)

    def warn_unreadable(self, dataset, indices: list[int], where: str) -> None:
        paths = [dataset.paths[i] for i in sorted(set(indices))]
        self.undecodable_files.update(paths)
        warn(self.accelerator, f"skipped {len(paths)} {where} image(s) that could not be decoded "
                               f"(corrupt or truncated): {describe_paths(paths)}")

    def save_and_stop(self) -> int:
        checkpoint = save_checkpoint(self.accelerator, self.args.output_dir,
                                     self.position.global_step)
        self.accelerator.print(f"{PROG}: stopped at step {self.position.global_step} by a signal; "
                               f"checkpoint saved to {checkpoint}; continue with "
                               "--resume_from_checkpoint latest")
        self.accelerator.end_training()
        return self.stop.exit_code()

    def finish(self) -> None:
        a = self.accelerator
        a.wait_for_everyone()
        save_model_replacing(a, self.model, self.args.output_dir)
        if a.is_main_process:
            metrics = self.metrics()
            write_replacing(self.args.output_dir / "metrics.json", json.dumps(metrics, indent=2) + "\n")
            a.print(f"{PROG}: eval accuracy {metrics['eval_accuracy']:.4f}, "
                    f"{metrics['train_images_per_second']:,.0f} training images/s; "
                    f"wrote {self.args.output_dir / 'metrics.json'}")
        a.end_training()

    def metrics(self) -> dict:
        a, args, position = self.accelerator, self.args, self.position
        started = process_start_time()
        first = self.first_step_finished_at
        return {
            "eval_accuracy": position.eval_accuracies[-1] if position.eval_accuracies else None,
            "eval_accuracy_per_epoch": position.eval_accuracies,
            "epochs": position.epoch,
            "global_step": position.global_step,
            "train_images_per_second": self.images_trained / self.train_seconds
            if self.train_seconds else None,
            "train_images_per_second_with_first_step":
            (self.images_trained + self.first_step[1]) / (self.train_seconds + self.first_step[0])
            if self.train_seconds else None,
            "train_images_per_second_per_epoch": self.epoch_rates,
            "time_to_first_step_s": first - started if first and started else None,
            "first_step_finished_at": first,
            "startup_s": STARTUP.since(started),
            "device": self.device.type,
            "decode": self.decode,
            "cached_images": len(self.image_cache.images) if self.image_cache else 0,
            "mixed_precision": a.mixed_precision,
            "num_processes": a.num_processes,
            "model": args.model,
            "image_size": args.image_size,
            "batch_size": args.batch_size,
            "train_images": len(self.train_set),
            "eval_images": len(self.eval_set),
            "skipped_images": len(self.skipped_files) + len(self.undecodable_files),
            "seed": args.seed,
        }


def process_start_time() -> float | None:
    try:
        import psutil  # an Accelerate dependency
        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - the metric is optional
        return None


def is_main_rank() -> bool:
    """Before Accelerator() exists: torchrun's RANK, so only one process reports input errors."""
    return os.environ.get("RANK", "0") == "0"


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        # Everything that can be checked cheaply is checked before any device is touched.
        samples, skipped = find_images(args.data_dir)
        check_model_choice(args.model, args.pretrained)
        checkpoint_to_resume(args)
        # WORLD_SIZE: torchrun's process count, which Accelerator() reads too.
        check_batch_fits(len(split_train_eval(samples, args.seed)[0]), args.batch_size,
                         int(os.environ.get("WORLD_SIZE", "1")))
        STARTUP.mark("inputs_checked")
        accelerator = make_accelerator(args)
        STARTUP.mark("accelerator_ready")
        trainer = Trainer(args, accelerator, samples, skipped)
        STARTUP.mark("model_and_loaders_ready")
        trainer.announce()
        trainer.resume()
        args.output_dir.mkdir(parents=True, exist_ok=True)
        return trainer.run()
    except InputError as error:
        if is_main_rank():
            print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C
        print(f"{PROG}: aborted without a checkpoint", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
