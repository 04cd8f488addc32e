"""Does training scale from 1 to N GPUs through `mpslaunch launch --num_processes N`?

One Accelerate script (a ResNet-50 on random images that live on the GPU, bf16) runs through the
real launcher with 1, then N processes; it prints images/s and the ratio, and checks that each
run trained correctly (Accelerate saw the plan, the loss fell, every rank's weights agree).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the driver


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    results = [launch(args, processes) for processes in (1, args.processes)]
    report = summarise(args, results)
    print(report_text(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["correct"] else 1


USAGE = """\
On the GPU machine, from the repository root:
  PYTHONPATH=src python3 benchmarks/ddp_scaling.py --processes 2 --json /tmp/ddp.json
A CPU smoke test of the same code paths (tiny sizes, gloo):
  python benchmarks/ddp_scaling.py --cpu --image-size 32 --batch-size 8 --steps 4 --warmup 2 --batches 1
Exit code 0 when both runs are correct (the ratio is reported, not judged); 1 otherwise.
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=USAGE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2, help="GPUs for the scaled run")
    parser.add_argument("--batch-size", type=int, default=128, help="images per GPU per step")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=100, help="timed steps")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--batches", type=int, default=4, help="distinct fixed batches per rank")
    parser.add_argument("--cpu", action="store_true", help="smoke test on the CPU (gloo)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def launch(args: argparse.Namespace, processes: int) -> dict:
    """One run through the real CLI; returns what rank 0 wrote."""
    with tempfile.TemporaryDirectory(prefix="ddp-scaling-") as folder:
        result = Path(folder) / "result.json"
        device = ["--cpu"] if args.cpu else ["--device", "cuda", "--mixed_precision", "bf16"]
        command = [sys.executable, "-m", "mpslaunch", "launch", *device,
                   "--num_processes", str(processes), __file__, "--worker", "--result", str(result),
                   *worker_options(args)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"),
                                                                          os.environ.get("PYTHONPATH")])),
               # A config folder of our own: no user profile applies, platformdirs is not needed.
               "MPSLAUNCH_CONFIG_DIR": folder}
        print(f"$ {' '.join(command[1:])}", flush=True)
        done = subprocess.run(command, env=env)
        if done.returncode != 0 or not result.exists():
            return {"processes": processes, "launcher_exit": done.returncode, "correct": False}
        return {**json.loads(result.read_text()), "launcher_exit": done.returncode}


def worker_options(args: argparse.Namespace) -> list[str]:
    return ["--batch-size", str(args.batch_size), "--image-size", str(args.image_size),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--batches", str(args.batches)]


def summarise(args: argparse.Namespace, results: list[dict]) -> dict:
    one, many = results
    ratio = None
    if one.get("images_per_s") and many.get("images_per_s"):
        ratio = many["images_per_s"] / one["images_per_s"]
    return {"device": "cpu" if args.cpu else "cuda", "batch_per_gpu": args.batch_size,
            "image_size": args.image_size, "timed_steps": args.steps, "runs": results,
            "scaling": ratio, "correct": all(run.get("correct") for run in results)}


def report_text(report: dict) -> str:
    lines = ["", f"{'processes':>9}  {'images/s':>10}  {'per process':>11}  {'loss first→last':>17}  "
                 f"{'replicas equal':>14}  {'accelerate':<26}  correct"]
    for run in report["runs"]:
        if "images_per_s" not in run:
            lines.append(f"{run['processes']:>9}  failed (launcher exit code {run['launcher_exit']})")
            continue
        loss = f"{run['loss_first']:.3f}→{run['loss_last']:.3f}"
        lines.append(f"{run['processes']:>9}  {run['images_per_s']:>10.1f}  "
                     f"{run['images_per_s'] / run['processes']:>11.1f}  {loss:>17}  "
                     f"{str(run['replicas_equal']):>14}  {run['accelerate']:<26}  {run['correct']}")
    if report["scaling"] is not None:
        n = report["runs"][1]["processes"]
        lines.append(f"scaling 1 → {n} processes: {report['scaling']:.2f}x "
                     f"({report['scaling'] / n:.0%} of linear)")
    lines.append(f"device {report['device']}, batch {report['batch_per_gpu']} per process, "
                 f"{report['image_size']}x{report['image_size']} images, {report['timed_steps']} timed steps")
    return "\n".join(lines)


# ---------------------------------------------------------------- the worker (each rank)


def worker(args: argparse.Namespace) -> int:
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()  # follows the launcher's plan (ACCELERATE_* and torchrun's vars)
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
    torch.backends.cudnn.benchmark = True
    model = resnet50().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    batches = fixed_batches(args, accelerator)

    losses = []
    for step in range(args.warmup):
        losses.append(train_step(model, optimizer, accelerator, batches[step % len(batches)]))
    synchronize(accelerator)
    start = time.perf_counter()
    for step in range(args.steps):
        losses.append(train_step(model, optimizer, accelerator, batches[step % len(batches)]))
    synchronize(accelerator)
    elapsed = time.perf_counter() - start

    images = args.steps * args.batch_size * accelerator.num_processes
    replicas_equal = parameters_equal_everywhere(accelerator, model)
    report = describe_run(accelerator, images / elapsed, losses, replicas_equal)
    if accelerator.is_main_process:
        Path(args.result).write_text(json.dumps(report))
    accelerator.print(json.dumps(report))
    accelerator.end_training()
    return 0


def fixed_batches(args: argparse.Namespace, accelerator) -> list:
    import torch

    generator = torch.Generator().manual_seed(1000 + accelerator.process_index)  # rank's own data
    batches = []
    for _ in range(args.batches):
        images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=generator)
        labels = torch.randint(0, 1000, (args.batch_size,), generator=generator)
        batches.append((images.to(accelerator.device).contiguous(memory_format=torch.channels_last),
                        labels.to(accelerator.device)))
    return batches


def train_step(model, optimizer, accelerator, batch) -> float:
    import torch.nn.functional as F

    images, labels = batch
    with accelerator.autocast():
        loss = F.cross_entropy(model(images), labels)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def synchronize(accelerator) -> None:
    import torch

    if accelerator.device.type == "cuda":
        torch.cuda.synchronize(accelerator.device)
    accelerator.wait_for_everyone()


def parameters_equal_everywhere(accelerator, model) -> bool:
    """Every rank's parameters, bit for bit, against rank 0's (broadcast)."""
    import torch

    flat = torch.cat([p.detach().float().reshape(-1) for p in accelerator.unwrap_model(model).parameters()])
    if accelerator.num_processes == 1:
        return True
    reference = flat.clone()
    torch.distributed.broadcast(reference, src=0)
    same = torch.tensor([int(torch.equal(flat, reference))], device=flat.device)
    torch.distributed.all_reduce(same, op=torch.distributed.ReduceOp.MIN)
    return bool(same.item())


def describe_run(accelerator, images_per_s: float, losses: list, replicas_equal: bool) -> dict:
    losses = [float(loss) for loss in losses]  # one device sync here, after timing
    window = max(1, min(5, len(losses) // 2))  # mean of the first and of the last few steps
    head, tail = losses[:window], losses[-window:]
    loss_first, loss_last = sum(head) / len(head), sum(tail) / len(tail)
    several = accelerator.num_processes > 1
    kind = str(accelerator.distributed_type).split(".")[-1]
    expected = ("MULTI_GPU" if accelerator.device.type == "cuda" else "MULTI_CPU") if several else "NO"
    # One GPU per rank: rank i on cuda:i (a single process may say plain "cuda").
    own_gpu = (accelerator.device.type != "cuda" or not several
               or accelerator.device.index == accelerator.local_process_index)
    planned_device = os.environ.get("MPSLAUNCH_DEVICE") == accelerator.device.type
    plan_followed = kind == expected and own_gpu and planned_device
    return {
        "processes": accelerator.num_processes,
        "images_per_s": images_per_s,
        "loss_first": loss_first,
        "loss_last": loss_last,
        "replicas_equal": replicas_equal,
        "accelerate": f"{kind}/{accelerator.state.backend or '-'}/{accelerator.device}",
        "correct": plan_followed and replicas_equal and loss_last < loss_first,
    }


# ---------------------------------------------------------------- ResNet-50


def resnet50():
    """ResNet-50 (He et al. 2015; torchvision's layout, v1.5 strides), without torchvision."""
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, inplanes: int, planes: int, stride: int):
            super().__init__()
            width, out = planes, planes * 4
            self.body = nn.Sequential(
                nn.Conv2d(inplanes, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out))
            self.shortcut = nn.Identity()
            if stride != 1 or inplanes != out:
                self.shortcut = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False),
                                              nn.BatchNorm2d(out))
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.shortcut(x))

    layers, inplanes = [], 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for index in range(blocks):
            layers.append(Bottleneck(inplanes, planes, stride if index == 0 else 1))
            inplanes = planes * 4
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))


if __name__ == "__main__":
    sys.exit(main())
