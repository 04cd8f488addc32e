"""--decode gpu: workers send JPEG bytes with each image's crop and flip, the training process
decodes and crops them on the GPU a few batches ahead; and which decode --decode auto picks."""

from __future__ import annotations

import os
import queue
import threading
from contextlib import nullcontext
from itertools import accumulate

import torch
import torchvision
from torch.utils.data import get_worker_info
from torchvision.io import ImageReadMode, decode_image, decode_jpeg
from torchvision.transforms import v2

from .cli import InputError
from .transfer import to_device

AUTO_GPU_DECODE_BYTES = 16_000  # Pet-sized photos ~120 KB: gpu; 64 px digits ~2 KB: cpu
GPU_DECODE_WORKERS = 4  # default DataLoader workers per process with --decode gpu (at most)


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
    """A training batch as the workers send it with --decode gpu: one object.

    labels, indices: each image's label and data set index; data: the JPEGs' bytes end to end
    (one shared-memory block, not one per image; None when the cache holds them all), split by
    sizes (0: held in the DecodedImageCache); jpeg_indices: their data set indices; meta: per
    JPEG (slot, left, top, right, bottom (roi_align's box), height, width, flip); ready: images
    the workers decoded themselves (PNGs, unusual JPEGs, unreadable ones), already transformed,
    at ready_positions in the batch.

    Only the bytes and the ready images are tensors: every tensor a worker sends costs the
    training process a file-descriptor handshake (~0.6 ms of its CPU per tensor and batch,
    measured on a 2-core CPU), and on a fast GPU that process's CPU bounds the step rate;
    lists travel inside the pickle for almost nothing.
    """

    def __init__(self, items: list, labels: list[int], indices: list[int]):
        jpegs = [(pos, item) for pos, item in enumerate(items) if isinstance(item, EncodedImage)]
        self.count = len(items)
        self.labels, self.indices = list(labels), list(indices)
        self.jpeg_positions = [pos for pos, _ in jpegs]
        self.jpeg_indices = [indices[pos] for pos, _ in jpegs]
        self.ready_positions = [pos for pos, item in enumerate(items)
                                if not isinstance(item, EncodedImage)]
        self.sizes = [len(item.data) for _, item in jpegs]
        self.data = self.join_bytes([item.data for _, item in jpegs]) if any(self.sizes) else None
        self.meta = [(slot, left, top, left + w, top + h, *item.size, item.flip)
                     for slot, (_, item) in enumerate(jpegs) for top, left, h, w in [item.box]]
        self.ready = (torch.stack([items[pos] for pos in self.ready_positions])
                      if self.ready_positions else None)

    @staticmethod
    def join_bytes(chunks: list[bytes]) -> torch.Tensor:
        data = torch.empty(sum(map(len, chunks)), dtype=torch.uint8)
        if get_worker_info() is not None:  # filled in place: no copy when it is sent
            data.share_memory_()
        buffer, at = data.numpy(), 0
        for chunk in chunks:
            buffer[at:at + len(chunk)] = memoryview(chunk)
            at += len(chunk)
        return data

    def pin_memory(self) -> EncodedBatch:
        """DataLoader(pin_memory=True) calls this: what is copied to the device gets pinned
        (the bytes are read by nvjpeg on the host)."""
        if self.ready is not None:
            self.ready = self.ready.pin_memory()
        return self


def collate_encoded(batch: list) -> EncodedBatch:
    items, labels, indices = zip(*batch)
    return EncodedBatch(list(items), labels, indices)


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


def edge_padded_canvas(images: list[torch.Tensor]) -> torch.Tensor:
    """The images (each (C, h, w), C the same) as one (N, C, H + 1, W + 1) tensor, H and W the
    largest height and width: each at the top left, its last row and column repeated out to the
    canvas's edge, so that sampling at an image's edge sees the edge (as interpolate's clamping
    does) and roi_align can crop them all in one call.

    One gather from all the images end to end, whatever N is: ~15 kernel launches, against
    ~70 for padding through a nested tensor (each launch is Python and driver work in a thread
    that shares the interpreter with the training loop).
    """
    channels = images[0].shape[0]
    heights = [image.shape[1] for image in images]
    widths = [image.shape[2] for image in images]
    flat = torch.cat([image.reshape(-1) for image in images])
    index_type = torch.int32 if flat.numel() < 2**31 else torch.int64
    starts = [0, *accumulate(channels * h * w for h, w in zip(heights[:-1], widths[:-1]))]
    height, width, start = to_device([heights, widths, starts], flat.device, index_type)
    rows = torch.arange(max(heights) + 1, device=flat.device, dtype=index_type)
    cols = torch.arange(max(widths) + 1, device=flat.device, dtype=index_type)
    rows = torch.minimum(rows, (height - 1)[:, None]) * width[:, None]  # (N, H + 1)
    cols = torch.minimum(cols, (width - 1)[:, None])  # (N, W + 1)
    planes = start[:, None] + torch.arange(channels, device=flat.device,
                                           dtype=index_type) * (height * width)[:, None]
    index = (planes[:, :, None] + rows[:, None, :])[..., None] + cols[:, None, None, :]
    return flat[index]


class JpegBatchDecoder:
    """EncodedBatch -> uint8 (N, 3, S, S) on the device, as train_transform would give it.

    All the JPEGs of a batch not in the cache are decoded in one call (nvjpeg batches them;
    baseline JPEGs go to the GPU's hardware decoder) and offered to the cache; all are placed
    in one canvas (edge_padded_canvas: each at the top left, its last row and column repeated,
    so sampling at an image's edge sees the edge, as interpolate's clamping does); roi_align then
    crops and resizes all of them in one kernel, averaging ceil(crop / S) x ceil(crop / S)
    bilinear samples per output pixel (a box filter against aliasing, where the CPU path uses
    antialiased bilinear resizing: the same crop and flip, pixel values within a few levels).
    A batch call that raises is retried image by image, then on the CPU; an image nothing
    decodes comes back blank and is returned in `failed`.
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

    def decode_or_recall(self, batch: EncodedBatch) -> tuple[list[torch.Tensor | None],
                                                             list[int]]:
        """Each JPEG of the batch decoded: from the cache when the worker sent no bytes, else
        decoded now (all in one call); and the slots decoded now."""
        encoded = torch.split(batch.data, batch.sizes) if batch.data is not None else ()
        fresh = [slot for slot, size in enumerate(batch.sizes) if size]
        images = [None if size else self.cache.get(batch.jpeg_indices[slot])
                  for slot, size in enumerate(batch.sizes)]
        decoded = self.decode([encoded[slot] for slot in fresh]) if fresh else []
        for slot, image in zip(fresh, decoded):
            images[slot] = image
        return images, fresh

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, list[int]]:
        return self.crop(batch, *self.decode_or_recall(batch))

    def crop(self, batch: EncodedBatch, images: list[torch.Tensor | None],
             fresh: list[int]) -> tuple[torch.Tensor, list[int]]:
        """The batch's images (decode_or_recall's) cropped, resized and flipped; the positions
        of those that did not decode."""
        size, device = self.size, self.device
        if not batch.jpeg_positions:
            return batch.ready.to(device, non_blocking=True), []
        meta = to_device(batch.meta, device, torch.float32)
        heights, widths = [jpeg[5] for jpeg in batch.meta], [jpeg[6] for jpeg in batch.meta]
        count = len(images)
        failed_slots = {slot for slot, (image, height, width)
                        in enumerate(zip(images, heights, widths))
                        if image is None or image.shape[1:] != (height, width)}
        if self.cache is not None:  # what decoded whole, to its header's size
            whole = [slot for slot in fresh if slot not in failed_slots]
            self.cache.add([batch.jpeg_indices[slot] for slot in whole],
                           [images[slot] for slot in whole])
        for slot in failed_slots:
            images[slot] = self.nothing  # its crop is blanked below
        failed = [batch.jpeg_positions[slot] for slot in sorted(failed_slots)]
        canvas = edge_padded_canvas(images)
        crops = torchvision.ops.roi_align(canvas.float(), meta[:, :5], output_size=size,
                                          spatial_scale=1.0, sampling_ratio=-1, aligned=True)
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
    """Runs the training loader and the stages that make its batches ready, each in a thread of
    its own, a few batches ahead of the training loop.

    With --decode gpu the stages are nvjpeg's batch call (~4 ms a batch of 64 photos on an idle
    H200, spent in C++ without the GIL, one call at a time: torchvision holds a lock around it
    and waits for the decode to finish) and the crops (~2 ms of launches). The nvjpeg thread
    also takes the batches from the loader (~2 ms a batch): a thread of its own for that was
    no faster on the H200. All stages work on one CUDA stream of their own, in order (each
    thread enqueues a batch's work only after the stage before has enqueued its own); the
    training stream waits for each batch's event, and record_stream keeps the memory until
    the training stream is done with it.
    """

    DONE = object()

    def __init__(self, loader, stages: list, device: torch.device, stream=None, depth: int = 3):
        self.loader, self.stages, self.device, self.depth = loader, stages, device, depth
        self.stream = stream  # CUDA: the same stream every epoch (the cache's images live on it)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        stop = threading.Event()
        cuda = self.device.type == "cuda"
        stream = self.stream if self.stream is not None or not cuda else torch.cuda.Stream(
            self.device)
        outputs = [queue.Queue(maxsize=self.depth) for _ in self.stages]

        def put(out: queue.Queue, item) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    pass
            return False

        def taken(source: queue.Queue):
            while not stop.is_set():
                try:
                    item = source.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item is self.DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item

        def work(source, stage, out: queue.Queue, last: bool) -> None:
            try:
                with torch.cuda.stream(stream) if cuda else nullcontext():
                    for item in source:
                        result = stage(item)
                        if last and cuda:
                            event = torch.cuda.Event()
                            event.record(stream)
                            result = (*result, event)
                        if not put(out, result):
                            return
            except BaseException as error:  # noqa: BLE001 - raised again in the training loop
                put(out, error)
                return
            put(out, self.DONE)

        sources = [iter(self.loader)] + [taken(out) for out in outputs[:-1]]
        threads = [threading.Thread(target=work, name=f"decode-ahead-{n}", daemon=True,
                                    args=(source, stage, out, n == len(self.stages) - 1))
                   for n, (source, stage, out) in enumerate(zip(sources, self.stages, outputs))]
        for thread in threads:
            thread.start()
        try:
            while True:
                item = outputs[-1].get()
                if item is self.DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                if cuda:
                    *tensors, event = item
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event)
                    for tensor in tensors:
                        tensor.record_stream(current)
                    item = tuple(tensors)
                yield item
        finally:
            stop.set()
            for thread in threads:
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
