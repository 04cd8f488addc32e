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
are only listed and their first bytes read). DataLoader workers are persistent and prefetch;
`--num_workers` defaults to the CPUs available to this process less one, shared among the
local processes (none when training on the CPU, whose cores torch's own threads already use).
A worker sends each batch as one object with at most one tensor (the images, or the JPEG
bytes): every tensor sent costs the training process a file-descriptor handshake, and on a fast
GPU that process's CPU bounds the step rate. Memory is pinned only for CUDA; channels_last is
used on CUDA and CPU (it slows convolutions' backward on MPS); fused AdamW on CUDA. cuDNN
autotuning (cudnn.benchmark) stays off: it searched for seconds before the first step on an
H200, for little gain on ResNets with cuDNN 9's heuristics. Mixed precision is the launcher's
choice (autocast through Accelerate).
`--decode gpu` (auto picks it on CUDA when the training JPEGs average 16 KB or more, i.e.
photos, not thumbnails): 4 workers only read the files and draw each image's crop and flip
(the same numbers the CPU path draws for the same seed); in the training process one thread
decodes each batch's JPEGs in one nvjpeg call and a second crops, resizes (roi_align,
box-filtered: pixel values within a few levels of the CPU path's) and flips them on the GPU, a
few batches ahead, on their own CUDA stream (the images padded into one canvas by one gather). The decoded images stay on the GPU
(`--image_cache_gb`, by default a quarter of its memory; 0 turns it off): from the second epoch
on, the workers read no file and send only the crops and flips, and nothing is decoded again.
Cached images are kept at full resolution, so a crop from the cache is bit-identical to one from
a fresh decode (a resumed run, whose cache starts empty, still ends like an uninterrupted one).
PNGs and JPEGs nvjpeg refuses are decoded as before; eval batches always decode in the workers.
CUDA graph (one CUDA process, precision no or bf16; `--no_cuda_graph` turns it off): after 3
eager steps the forward and backward pass is recorded once and replayed, one launch instead of
~300 kernels launched from Python; the optimizer and the schedule still step eagerly. On an H200
the replayed run gave bit-identical losses and weights to the eager one (fp32 and bf16).
Measured on one H200 with 16 CPU cores, resnet18 fp32, batch 64, Pet-sized photos at 224 px
(benchmarks/cv_throughput.py; numbers and logs in the README): the step is bound by the GPU
(~7.9 ms of its ~8.8 ms); with the graph and the cache, training reaches 0.89-0.91 of the
graphed step rate from the second epoch on (0.86-0.88 on slower machine starts), but
0.54-0.59 in the first, which decodes every JPEG: torchvision runs one nvjpeg call at a time
and waits for it, 7-9 ms a batch of 64 beside the training: 0.72-0.77 over 3 epochs. About
7-11 of the 9-13 s before the first step there are Python importing torch, torchvision and
Accelerate (torchvision's ops import torch._dynamo: ~4 s on that machine).
On macOS, Python spawns the workers (Linux forks them): each imports torch and torchvision again
before its first batch. Forced to spawn on the 2-core Linux machine, the first step of the demo
came 9.9 s after the start instead of 5.9 s (no Mac was available to measure it there).

Progress: a tqdm bar on the main process with loss and images/s, the eval accuracy after each
epoch, and at the end `metrics.json` in `--output_dir`:
  eval_accuracy, eval_accuracy_per_epoch, epochs, global_step, train_images_per_second
  (images trained by all processes / seconds spent in training loops, waiting for data
  included, eval excluded, counted from the end of the first step, which is start-up; for a
  resumed run, only the part run now), the same for each epoch
  (train_images_per_second_per_epoch) and with the first step included
  (train_images_per_second_with_first_step), time_to_first_step_s (from the process start to
  the end of the first optimizer step), first_step_finished_at (Unix time), startup_s (seconds
  from the process start to each start-up phase), data_wait_s_per_epoch (seconds the loop
  stood waiting for its next batch), device, decode, cached_images, cuda_graph,
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
import os
import signal
import sys
from pathlib import Path

# The package is beside this file; loaded by path (tests, benchmarks) its folder is not on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cv_classifier.checkpoints import checkpoint_to_resume
from cv_classifier.cli import (PROG, InputError, OneLineParser, checkpointing_steps,
                               non_negative_float, non_negative_int, positive_int)
from cv_classifier.images import check_batch_fits, find_images, split_train_eval
from cv_classifier.model import check_model_choice
from cv_classifier.startup import STARTUP
from cv_classifier.trainer import Trainer, make_accelerator

STARTUP.mark("imports_done")


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
    parser.add_argument("--no_cuda_graph", action="store_true",
                        help="run every step eagerly (by default one CUDA process replays the "
                             "forward and backward pass as a CUDA graph)")
    parser.add_argument("--cpu", action="store_true", help="Accelerator(cpu=True)")
    parser.add_argument("--mixed_precision", choices=("no", "fp16", "bf16"), default=None,
                        help="Accelerator(mixed_precision=...); default: the launcher's plan")
    args = parser.parse_args(argv)
    if not args.lr > 0:
        raise InputError(f"argument --lr: must be positive, got {args.lr}")
    return args


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
