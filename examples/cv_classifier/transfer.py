"""Host-to-device copies of the small per-batch tensors (labels, indices, crop boxes)."""

from __future__ import annotations

import torch


def to_device(values: list, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A small host list as a tensor on the device, queued without waiting: on CUDA the copy
    starts from pinned memory (from pageable memory the driver may first wait for all the work
    queued on the stream, and the thread that asked, a step ahead of the GPU, would wait too)."""
    tensor = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
