"""The model: a torchvision classifier (from scratch or cached weights), its optimizer and
schedule, normalisation on the device, one training step, evaluation."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

import torch
import torch.nn.functional as F
import torchvision

from .cli import InputError
from .data import UNREADABLE


IMAGENET_MEAN = (0.485, 0.456, 0.406)

IMAGENET_STD = (0.229, 0.224, 0.225)


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
