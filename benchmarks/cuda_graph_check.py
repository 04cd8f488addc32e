"""Does cv_example's CUDA-graph step train exactly like its eager step? (needs a CUDA GPU)

From the same seed, runs 12 steps of resnet18 (batch 64, 224 px, one unreadable label in
step 6) eagerly and then replayed as a CUDA graph, and prints both loss sequences and whether
the weights and BatchNorm buffers ended bit-identical. One precision per process (Accelerate's
state is per process):

    PYTHONPATH=src python3 benchmarks/cuda_graph_check.py no
    PYTHONPATH=src python3 benchmarks/cuda_graph_check.py bf16
"""

from __future__ import annotations

import argparse
import sys

import torch

from cv_throughput import import_cv_classifier

STEPS = 12


def train(cuda_graph: bool, precision: str):
    from cv_classifier.data import UNREADABLE
    from cv_classifier.model import (Normalizer, build_model, make_optimizer, make_train_step,
                                     memory_format_for)
    from cv_classifier.trainer import make_accelerator
    accelerator = make_accelerator(argparse.Namespace(cpu=False, mixed_precision=precision))
    device = accelerator.device
    memory_format = memory_format_for(device)
    torch.manual_seed(0)
    model = build_model("resnet18", 37, False).to(memory_format=memory_format)
    optimizer, scheduler = make_optimizer(model, 3e-3, 100, device)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    step = make_train_step(accelerator, model, optimizer, scheduler,
                           Normalizer(device, memory_format), cuda_graph=cuda_graph)
    data = torch.Generator().manual_seed(1)
    losses = []
    for number in range(STEPS):
        images = torch.randint(0, 256, (64, 3, 224, 224), dtype=torch.uint8, generator=data)
        labels = torch.randint(0, 37, (64,), generator=data)
        if number == 5:
            labels[3] = UNREADABLE
        losses.append(step(images.to(device), labels.to(device)).item())
    graphed = getattr(step, "graph", None) is not None
    return (losses, graphed, [p.detach().cpu() for p in model.parameters()],
            [b.cpu() for b in model.buffers()])


def main(precision: str) -> int:
    import_cv_classifier()
    eager_losses, _, eager_weights, eager_buffers = train(False, precision)
    graph_losses, graphed, graph_weights, graph_buffers = train(True, precision)
    print(f"{precision}: graph recorded: {graphed}")
    print(f"{precision}: losses eager {[round(x, 4) for x in eager_losses]}")
    print(f"{precision}: losses graph {[round(x, 4) for x in graph_losses]}")
    same_weights = all(torch.equal(a, b) for a, b in zip(eager_weights, graph_weights))
    same_buffers = all(torch.equal(a, b) for a, b in zip(eager_buffers, graph_buffers))
    print(f"{precision}: weights bit-identical: {same_weights}, buffers: {same_buffers}")
    return 0 if graphed and same_weights and same_buffers else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "no"))
