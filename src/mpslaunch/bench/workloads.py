"""What `mpslaunch bench` measures: matvec (B @ a, memory bound), matmul (B @ A, compute bound)
and train (one step of a small CNN on 3x32x32 images; the size is the batch size).

`prepare` allocates the inputs on the device and returns the op as a closure; float16 and
bfloat16 train under torch.autocast, as mixed-precision training does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mpslaunch.bench.devices import torch_dtype

IMAGE_SHAPE = (3, 32, 32)
NUM_CLASSES = 10


Op = Callable[[], object]


def flops(workload: str, size: int) -> float:
    if workload == "matvec":
        return 2.0 * size * size
    if workload == "matmul":
        return 2.0 * size**3
    return _train_flops_per_sample() * size


def bytes_needed(workload: str, dtype: str, size: int) -> int:
    """Bytes the inputs and output take (matvec, matmul); for train an upper estimate of a step."""
    element = torch.empty((), dtype=torch_dtype(dtype)).element_size()
    if workload == "matvec":
        return element * (size * size + 2 * size)
    if workload == "matmul":
        return element * 3 * size * size
    per_sample, model = _train_bytes()
    return per_sample * size + model


def prepare(workload: str, device: str, dtype: str, size: int) -> Op:
    builders = {"matvec": _prepare_matvec, "matmul": _prepare_matmul, "train": _prepare_train}
    return builders[workload](torch.device(device), torch_dtype(dtype), size)


def _prepare_matvec(device: torch.device, dtype: torch.dtype, size: int) -> Op:
    matrix = torch.randn(size, size, device=device, dtype=dtype)
    vector = torch.randn(size, device=device, dtype=dtype)
    out = torch.empty(size, device=device, dtype=dtype)
    return lambda: torch.matmul(matrix, vector, out=out)


def _prepare_matmul(device: torch.device, dtype: torch.dtype, size: int) -> Op:
    left = torch.randn(size, size, device=device, dtype=dtype)
    right = torch.randn(size, size, device=device, dtype=dtype)
    # A preallocated output keeps allocator (and, on cpu, page-fault) time out of the sample.
    out = torch.empty(size, size, device=device, dtype=dtype)
    return lambda: torch.matmul(left, right, out=out)


def small_cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 128),
        nn.ReLU(),
        nn.Linear(128, NUM_CLASSES),
    )


def _prepare_train(device: torch.device, dtype: torch.dtype, size: int) -> Op:
    torch.manual_seed(0)
    model = small_cnn().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(size, *IMAGE_SHAPE, device=device)
    labels = torch.randint(0, NUM_CLASSES, (size,), device=device)
    autocast = dtype != torch.float32  # no GradScaler: only the time of a step matters here

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=dtype, enabled=autocast):
            loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()

    return step


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


_train_bytes_cache: list[tuple[int, int]] = []
# Each layer's output is kept for the backward pass and gets a gradient of the same size,
# counted in float32 whatever the dtype (autocast keeps float32 copies): above what a step takes
# on the cpu. The model: weights, gradients, momentum and an autocast copy.
_ACTIVATION_COPIES = 2
_MODEL_COPIES = 4


def _train_bytes() -> tuple[int, int]:
    """(bytes one image costs a training step, bytes of the model), counted once on the cpu."""
    if not _train_bytes_cache:
        model = small_cnn()
        outputs: list[int] = []
        hooks = [
            layer.register_forward_hook(lambda _, __, out: outputs.append(out.numel()))
            for layer in model
        ]
        with torch.no_grad():
            model(torch.zeros(1, *IMAGE_SHAPE))
        for hook in hooks:
            hook.remove()
        image = 4 * (IMAGE_SHAPE[0] * IMAGE_SHAPE[1] * IMAGE_SHAPE[2]) + 8  # and its label
        per_sample = _ACTIVATION_COPIES * 4 * sum(outputs) + image
        weights = sum(parameter.numel() for parameter in model.parameters())
        _train_bytes_cache.append((per_sample, _MODEL_COPIES * 4 * weights))
    return _train_bytes_cache[0]
