"""The data pipeline: image files decoded and augmented (seeded per image), the epoch shuffle,
the DataLoaders."""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate, get_worker_info
from torchvision.io import ImageReadMode, decode_image, read_file
from torchvision.transforms import v2

from .gpu_decode import EncodedImage, augmentation_params, jpeg_size
from .transfer import to_device


UNREADABLE = -100  # label of an image that failed to decode; cross_entropy's ignore_index


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


class Targets:
    """A training batch's labels and data set indices as plain lists: inside the batch a worker
    sends, they cost no tensor each (see gpu_decode.EncodedBatch), and Accelerate passes the
    object on untouched."""

    __slots__ = ("labels", "indices")

    def __init__(self, labels, indices):
        self.labels, self.indices = list(labels), list(indices)

    def on(self, device: torch.device,
           unreadable: list[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """Labels and indices as tensors on the device (one copy); the labels at the positions
        in `unreadable` become UNREADABLE."""
        labels = list(self.labels)
        for position in unreadable:
            labels[position] = UNREADABLE
        both = to_device([labels, self.indices], device)
        return both[0], both[1]


def collate_decoded(batch: list) -> tuple[torch.Tensor, Targets]:
    """Training batches decoded in the workers: the images stacked by torch's default collate
    (straight into shared memory), labels and indices as Targets."""
    images, labels, indices = zip(*batch)
    return default_collate(list(images)), Targets(labels, indices)


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
