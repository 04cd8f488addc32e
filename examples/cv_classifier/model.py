"""The model: a torchvision classifier (from scratch or cached weights), its optimizer and
schedule, normalisation on the device, one training step, evaluation."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from urllib.parse import urlparse

import torch
import torch.nn.functional as F
import torchvision

from .cli import InputError, first_line
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


def batch_loss(model, normalize, images, labels) -> torch.Tensor:
    """Mean cross-entropy over the readable images (a batch of only unreadable ones gives 0)."""
    logits = model(normalize(images))
    readable = (labels != UNREADABLE).sum().clamp_min(1)
    return F.cross_entropy(logits, labels, ignore_index=UNREADABLE, reduction="sum") / readable


def train_step(accelerator, model, optimizer, scheduler, normalize, images, labels):
    """One optimizer step; returns the loss, still on the device (reading it would sync)."""
    loss = batch_loss(model, normalize, images, labels)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def cuda_graph_usable(device_type: str, num_processes: int, mixed_precision: str) -> bool:
    """Where the forward and backward pass can be replayed as one CUDA graph: one CUDA process
    (DDP's all-reduce hooks are left out) without fp16's GradScaler (it reads the gradients'
    finiteness back to the CPU each step)."""
    return device_type == "cuda" and num_processes == 1 and mixed_precision != "fp16"


class GraphedTrainStep:
    """train_step with the forward and backward pass recorded once as a CUDA graph.

    Eager, a ResNet-18 step launches some 300 kernels, one Python call each: ~5 ms of the
    training process's CPU on the H200 machine, which the decode threads then wait for (the
    GIL). Replayed, the whole pass is one launch. The first WARMUP steps run eagerly on a side
    stream (CUDA's rule for capture: lazy initialisation and cuDNN's choices happen there); the
    next batch is captured into fixed input tensors and every later batch is copied into them.
    The gradients live in the graph's memory and are overwritten by each replay, so they are
    not zeroed between steps; the optimizer and the schedule still step eagerly (fused AdamW:
    one kernel). If a model cannot be captured (a step that reads a value back to the CPU, ...),
    training goes on eagerly, `fallback` says why and `warn` is told once.
    """

    WARMUP = 3

    def __init__(self, accelerator, model, optimizer, scheduler, normalize, warn=print):
        self.accelerator, self.model, self.warn = accelerator, model, warn
        self.optimizer, self.scheduler, self.normalize = optimizer, scheduler, normalize
        self.graph = None
        self.steps_before_capture = self.WARMUP
        self.fallback: str | None = None
        self.side_stream = torch.cuda.Stream()

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        step = (self.model, self.optimizer, self.scheduler, self.normalize, images, labels)
        if self.fallback is not None:
            return train_step(self.accelerator, *step)
        if self.graph is None and self.steps_before_capture > 0:
            self.steps_before_capture -= 1
            return self.on_side_stream(lambda: train_step(self.accelerator, *step))
        if self.graph is None and not self.capture(images, labels):
            return train_step(self.accelerator, *step)
        self.images.copy_(images)
        self.labels.copy_(labels)
        self.graph.replay()
        self.optimizer.step()
        self.scheduler.step()
        return self.loss.clone()  # the graph's own tensor is overwritten by the next replay

    def on_side_stream(self, work):
        side = self.side_stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            result = work()
        torch.cuda.current_stream().wait_stream(side)
        return result

    def capture(self, images: torch.Tensor, labels: torch.Tensor) -> bool:
        self.images, self.labels = images.clone(), labels.clone()
        self.optimizer.zero_grad(set_to_none=True)  # the graph allocates the gradients
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: the decode threads keep allocating and decoding meanwhile.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                loss = batch_loss(self.model, self.normalize, self.images, self.labels)
                self.accelerator.backward(loss)
        except RuntimeError as error:
            self.fallback = first_line(error) or type(error).__name__
            self.optimizer.zero_grad(set_to_none=True)
            self.warn(f"the step could not be recorded as a CUDA graph ({self.fallback}); it "
                      "runs eagerly (--no_cuda_graph skips the attempt)")
            return False
        self.graph, self.loss = graph, loss.detach()
        return True


def make_train_step(accelerator, model, optimizer, scheduler, normalize, cuda_graph: bool,
                    warn=print):
    """The step the training loop calls with (images, labels): graphed where it can be (`warn`
    hears once if the graph cannot be recorded)."""
    if cuda_graph and cuda_graph_usable(accelerator.device.type, accelerator.num_processes,
                                        accelerator.mixed_precision):
        return GraphedTrainStep(accelerator, model, optimizer, scheduler, normalize, warn)
    return functools.partial(train_step, accelerator, model, optimizer, scheduler, normalize)


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
