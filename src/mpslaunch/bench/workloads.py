"""What `mpslaunch bench` measures: one op per workload, built for a device, dtype and size.

- matvec: `B @ a` with B an m x m matrix and a an m-vector (the classic blog measurement;
  memory bound: it reads every element of B once). 2*m^2 FLOPs.
- matmul: `B @ A` with both m x m. Compute bound for large m. 2*m^3 FLOPs.
- train: one training step (zero_grad, forward, cross-entropy, backward, SGD step) of a small
  CNN on a batch of 3x32x32 images; the size is the batch size. FLOPs counted by
  torch.utils.flop_counter for forward + backward (the optimizer step is negligible). float16
  and bfloat16 run the forward under torch.autocast, as mixed-precision training does; no
  GradScaler, as only the time is of interest.

`prepare` allocates the inputs on the device and returns the op as a closure; dropping the
returned Prepared frees them. `bytes_needed` is a lower bound used to skip sizes that cannot fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from mpslaunch.bench.devices import torch_dtype

WORKLOADS = ("matvec", "matmul", "train")
DEFAULT_WORKLOADS = ("matvec", "matmul", "train")

IMAGE_SHAPE = (3, 32, 32)
NUM_CLASSES = 10


@dataclass
class Prepared:
    op: Callable[[], object]
    flops: float


def flops(workload: str, size: int) -> float:
    if workload == "matvec":
        return 2.0 * size * size
    if workload == "matmul":
        return 2.0 * size**3
    return _train_flops_per_sample() * size


def bytes_needed(workload: str, dtype: str, size: int) -> int | None:
    """Bytes the inputs and output take; None when it is not a simple formula (train)."""
    element = torch.empty((), dtype=torch_dtype(dtype)).element_size()
    if workload == "matvec":
        return element * (size * size + 2 * size)
    if workload == "matmul":
        return element * 3 * size * size
    return None


def prepare(workload: str, device: str, dtype: str, size: int) -> Prepared:
    builders = {"matvec": _prepare_matvec, "matmul": _prepare_matmul, "train": _prepare_train}
    return builders[workload](torch.device(device), torch_dtype(dtype), size)


def _prepare_matvec(device: torch.device, dtype: torch.dtype, size: int) -> Prepared:
    matrix = torch.randn(size, size, device=device, dtype=dtype)
    vector = torch.randn(size, device=device, dtype=dtype)
    out = torch.empty(size, device=device, dtype=dtype)
    return Prepared(op=lambda: torch.matmul(matrix, vector, out=out), flops=flops("matvec", size))


def _prepare_matmul(device: torch.device, dtype: torch.dtype, size: int) -> Prepared:
    left = torch.randn(size, size, device=device, dtype=dtype)
    right = torch.randn(size, size, device=device, dtype=dtype)
    # A preallocated output keeps allocator (and, on cpu, page-fault) time out of the sample.
    out = torch.empty(size, size, device=device, dtype=dtype)
    return Prepared(op=lambda: torch.matmul(left, right, out=out), flops=flops("matmul", size))


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 128), nn.ReLU(),
        nn.Linear(128, NUM_CLASSES),
    )


def _prepare_train(device: torch.device, dtype: torch.dtype, size: int) -> Prepared:
    torch.manual_seed(0)
    model = small_cnn().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(size, *IMAGE_SHAPE, device=device)
    labels = torch.randint(0, NUM_CLASSES, (size,), device=device)
    autocast = dtype != torch.float32

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=dtype, enabled=autocast):
            loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()

    return Prepared(op=step, flops=flops("train", size))


_train_flops_cache: list[float] = []


def _train_flops_per_sample() -> float:
    """Forward + backward FLOPs of the CNN for one image, counted once on the cpu."""
    if not _train_flops_cache:
        from torch.utils.flop_counter import FlopCounterMode

        model = small_cnn()
        images = torch.randn(1, *IMAGE_SHAPE)
        labels = torch.zeros(1, dtype=torch.long)
        with FlopCounterMode(display=False) as counter:
            nn.functional.cross_entropy(model(images), labels).backward()
        _train_flops_cache.append(float(counter.get_total_flops()))
    return _train_flops_cache[0]
