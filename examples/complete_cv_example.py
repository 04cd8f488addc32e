"""cv_example.py's training plus what a long run needs: checkpoints, an exact resume, a clean stop.

    mpslaunch launch examples/complete_cv_example.py --data_dir images --image_size 64 \\
        --checkpointing_steps epoch    # and, after a stop, to go on where it stopped:
    mpslaunch launch examples/complete_cv_example.py --data_dir images --image_size 64 \\
        --checkpointing_steps epoch --resume_from_checkpoint latest

Checkpoints go to `--output_dir`/checkpoints, whole or not at all: a full disk ends the run with
one line and leaves the earlier ones as they were. A resume, mid-epoch too, ends with the very
weights of a run that never stopped. SIGTERM or Ctrl-C finishes the step, saves and exits with
128 + the signal number (143, 130), every process at the same step; a second Ctrl-C stops now."""

import argparse
import json
import os
import re
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path

import torch
import torchvision
from accelerate import Accelerator
from accelerate.utils import set_seed
from PIL import Image
from torch.utils.data import DataLoader, Dataset, RandomSampler, random_split
from torchvision.io import ImageReadMode, decode_jpeg, read_file
from torchvision.transforms import v2

PROG = "complete_cv_example"
SKIPPED = -100  # the label of an image that does not decode: loss and accuracy leave it out
STOP = {}  # the first SIGTERM or SIGINT: {"signal": number}


class InputError(Exception):
    """Bad input: reported as one line, `complete_cv_example: error: ...`, and exit code 2."""


def find_images(data_dir: Path, seed: int) -> tuple[list[str], list, list]:
    """The class names, then the training and the evaluation (path, class) pairs, 80/20."""
    samples = []
    for path in sorted(data_dir.rglob("*")):  # the class: a sub-folder, or a Pet-style name
        parts, named = path.relative_to(data_dir).parts, re.match(r"(.+)_\d+$", path.stem)
        label = parts[0] if len(parts) > 1 else named and named[1]
        if label and path.suffix.lower() in (".jpg", ".jpeg", ".png") and path.is_file() \
                and not any(part.startswith(".") for part in parts):  # not macOS `._*` files
            samples.append((path, label))
    classes = sorted({label for _, label in samples})
    if len(classes) < 2:  # a missing or empty folder, one of other files, one of one class
        found = f"images of {len(classes)} class(es)" if data_dir.is_dir() else "no such folder"
        raise InputError(f"--data_dir {data_dir}: {found}; it needs Label_Name_123.jpg files or "
                         "one sub-folder of .jpg/.png files per class, two classes or more "
                         f"(a demo set: python examples/make_demo_images.py {data_dir})")
    samples = [(path, classes.index(label)) for path, label in samples]
    eval_count = max(1, round(len(samples) * 0.2))
    return classes, *random_split(samples, [len(samples) - eval_count, eval_count],
                                  generator=torch.Generator().manual_seed(seed))


class EpochOrder(RandomSampler):
    """A shuffle drawn from the epoch alone, of (index, epoch) pairs: an image's crop and flip
    come from its pair, the same in any worker, in a run that goes on or resumes mid-epoch."""

    def set_epoch(self, epoch: int) -> None:  # the prepared loader's set_epoch() calls it
        self.epoch = epoch
        self.generator.manual_seed(epoch)

    def __iter__(self):
        return ((index, self.epoch) for index in super().__iter__())


class ImageFiles(Dataset):
    """(uint8 image, label), decoded and cropped in workers; `unreadable` marks damaged files."""

    def __init__(self, samples: list[tuple[Path, int]], image_size: int, train: bool):
        self.samples, self.image_size = samples, image_size
        self.unreadable = torch.zeros(len(samples), dtype=torch.bool).share_memory_()
        self.transform = v2.Compose(
            [v2.RandomResizedCrop(image_size, scale=(0.35, 1.0)), v2.RandomHorizontalFlip()]
            if train else [v2.Resize(round(image_size / 0.875)), v2.CenterCrop(image_size)])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        index, epoch = item if isinstance(item, tuple) else (item, 0)
        path, label = self.samples[index]
        try:  # torchvision's JPEG reader (libjpeg-turbo), the quickest
            image = decode_jpeg(read_file(str(path)), mode=ImageReadMode.RGB)
        except RuntimeError:  # a PNG or a damaged file: Pillow, which raises on a damaged one
            try:  # (torchvision's PNG reader can crash the process on those)
                with Image.open(path) as picture:
                    image = v2.functional.pil_to_tensor(picture.convert("RGB"))
            except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
                self.unreadable[index] = True
                return torch.zeros(3, self.image_size, self.image_size, dtype=torch.uint8), SKIPPED
        with torch.random.fork_rng(devices=[]):  # the CPU generator is as it was after: in the
            torch.random.default_generator.manual_seed(epoch * len(self) + index)  # training
            return self.transform(image), label


def ignore_stop_signals(_worker_id: int) -> None:
    """DataLoader workers leave Ctrl-C and SIGTERM to the training process, which saves."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def ask_to_stop(number: int, _frame) -> None:
    STOP.setdefault("signal", number)  # the loop saves and stops; a second Ctrl-C at once:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt


def normalize(images: torch.Tensor) -> torch.Tensor:  # uint8 batches: 4x less to copy than float
    return (images.float() - 114.5) / 57.6  # ImageNet's mean and spread of pixel values


class Progress(dict):  # {"global_step", "eval_accuracies"}: in each checkpoint
    def state_dict(self) -> dict:
        return dict(self)

    def load_state_dict(self, state: dict) -> None:
        self.update(state)


def save_whole(accelerator, save, final: Path) -> Path:
    """save(folder) writes into final.partial, renamed once every process is done: a save that
    fails (a full disk) or is killed never looks whole, and the ones before it stay as they were."""
    partial = final.with_name(final.name + ".partial")
    try:
        save(str(partial))
    except (OSError, RuntimeError) as error:  # torch.save and safetensors raise one of them
        shutil.rmtree(partial, ignore_errors=True)
        free = shutil.disk_usage(final.parent).free / 2**20
        sys.exit(f"{PROG}: error: cannot save {final} ({free:,.1f} MiB free there: "  # code 1
                 f"{str(error).strip().splitlines()[0]}); make room or choose another "
                 "--output_dir; the checkpoints before it are whole")
    accelerator.wait_for_everyone()  # each process has written its part (its random states)
    if accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)  # the model of an earlier run
        partial.rename(final)
    accelerator.wait_for_everyone()
    return final


@torch.no_grad()
def evaluate(accelerator, model, loader) -> float:
    model.eval()
    correct = total = 0
    for images, labels in loader:
        predictions = model(normalize(images)).argmax(dim=1)
        # gather_for_metrics(): all processes' predictions (mps: one), less the last batch's fill
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        correct, total = correct + (predictions == labels).sum(), total + (labels != SKIPPED).sum()
    model.train()
    return int(correct) / max(1, int(total))


def train(args) -> int:  # the exit code: 0, or 128 + N after signal N
    classes, train_set, eval_set = find_images(args.data_dir, args.seed)
    set_seed(args.seed)  # Python's, NumPy's and torch's generators (the devices' too)
    if args.model not in torchvision.models.list_models(module=torchvision.models):
        raise InputError(f"unknown --model {args.model!r}; use a torchvision classification "
                         "model, e.g. resnet18, resnet50, mobilenet_v3_small, efficientnet_b0")
    model = torchvision.models.get_model(args.model, num_classes=len(classes))
    # Accelerator(): the launcher's device (mps, a GPU or the CPU), precision and processes
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
    device, processes = accelerator.device, accelerator.num_processes
    if len(train_set) < args.batch_size * processes:  # each process needs a full batch
        raise InputError(f"--batch_size {args.batch_size} x {processes} process(es) is more than "
                         f"the {len(train_set)} training images")
    datasets = [ImageFiles(samples, args.image_size, train=samples is train_set)
                for samples in (train_set, eval_set)]
    # In line on the CPU (it trains on all cores); beside a GPU, persistent workers (macOS spawns
    # them) on all CPUs but one per process, and pinned copies during the step (mps pins none).
    workers, local_processes = args.num_workers, int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if workers is None:
        workers = 0 if device.type == "cpu" else max(1, os.cpu_count() // local_processes - 1)
    accelerator.dataloader_config.non_blocking = pinned = device.type not in ("cpu", "mps")
    options = dict(batch_size=args.batch_size, num_workers=workers, persistent_workers=workers > 0,
                   pin_memory=pinned, worker_init_fn=ignore_stop_signals,
                   generator=torch.Generator())  # its own: the training's (dropout's) stays as is
    order = EpochOrder(train_set, generator=torch.Generator())  # reseeded at each epoch
    train_loader = DataLoader(datasets[0], sampler=order, drop_last=True, **options)
    eval_loader = DataLoader(datasets[1], **options)
    if device.type != "mps":  # channels_last speeds convolutions up on GPUs and CPUs, not mps
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr / 25)  # one cycle: a warm-up
    scheduler = torch.optim.lr_scheduler.OneCycleLR(  # to --lr, then down; the steps counted
        optimizer, args.lr, total_steps=args.num_epochs * len(train_loader))  # before prepare()
    # prepare(): the model to the device (in DDP with processes); each its share of the batches
    model, optimizer, scheduler, train_loader, eval_loader = accelerator.prepare(
        model, optimizer, scheduler, train_loader, eval_loader)
    progress = Progress(global_step=0, eval_accuracies=[])
    accelerator.register_for_checkpointing(progress)  # save_state() and load_state() include it
    checkpoint = args.resume_from_checkpoint
    if checkpoint == "latest":  # zero-padded step numbers: the last name is the latest
        checkpoint = max((args.output_dir / "checkpoints").glob("step_*[0-9]"), default=None)
        if checkpoint is None:
            accelerator.print(f"{PROG}: no checkpoint in {args.output_dir}/checkpoints yet")
    elif checkpoint and not Path(checkpoint).is_dir():
        raise InputError(f"--resume_from_checkpoint {checkpoint}: no such checkpoint folder")
    if checkpoint:  # load_state(): weights, optimizer, schedule, progress, random states, onto
        accelerator.load_state(str(checkpoint))  # this device (a save from mps resumes on a GPU)
        accelerator.print(f"{PROG}: resumed from {checkpoint} at step {progress['global_step']}")
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, ask_to_stop)
    images_per_step, steps_per_epoch = train_loader.total_batch_size, len(train_loader)

    def save_checkpoint() -> Path:  # save_state(): each process writes its part
        final = args.output_dir / "checkpoints" / f"step_{progress['global_step']:08d}"
        return final if final.exists() else save_whole(accelerator, accelerator.save_state, final)

    for epoch in range(len(progress["eval_accuracies"]), args.num_epochs):
        done = progress["global_step"] - epoch * steps_per_epoch  # steps of it before a resume
        train_loader.set_epoch(epoch)  # the order and crops of this epoch (EpochOrder)
        # skip_first_batches(): the loader without the batches done before the checkpoint.
        loader = accelerator.skip_first_batches(train_loader, done) if done else train_loader
        started, loss_sum, steps = time.perf_counter(), torch.zeros((), device=device), 0
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(normalize(images)), labels,
                                                     reduction="sum", ignore_index=SKIPPED)
            loss = loss / (labels != SKIPPED).sum().clamp_min(1)  # the mean over decoded images
            accelerator.backward(loss)  # scales fp16 losses; DDP averages the processes'
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss_sum, steps = loss_sum + loss.detach(), steps + 1
            progress["global_step"] += 1
            if str(args.checkpointing_steps).isdigit() \
                    and progress["global_step"] % int(args.checkpointing_steps) == 0:
                save_checkpoint()
            if STOP and processes > 1:  # check_trigger(): True in all once one set it
                accelerator.set_trigger()  # (an all-reduce); one process (as on mps) needs none
            if STOP if processes == 1 else accelerator.check_trigger():
                accelerator.print(f"{PROG}: stopped at step {progress['global_step']} by a signal; "
                                  f"saved {save_checkpoint()}; continue with "
                                  "--resume_from_checkpoint latest")
                accelerator.end_training()
                return 128 + STOP.get("signal", signal.SIGTERM)  # SIGTERM: another's signal
        loss = accelerator.reduce(loss_sum, reduction="mean").item() / max(1, steps)  # all's
        images_per_second = steps * images_per_step / (time.perf_counter() - started)
        progress["eval_accuracies"].append(evaluate(accelerator, model, eval_loader))
        accelerator.print(f"{PROG}: epoch {epoch + 1}/{args.num_epochs}: loss {loss:.3f}, "
                          f"{images_per_second:,.0f} training images/s, eval accuracy "
                          f"{progress['eval_accuracies'][-1]:.4f}")
        if args.checkpointing_steps == "epoch":
            save_checkpoint()
    # save_model(): the weights alone (model.safetensors), unwrapped from DDP, by one process.
    save_whole(accelerator, lambda folder: accelerator.save_model(model, folder),
               args.output_dir / "model")
    marks = torch.cat([dataset.unreadable for dataset in datasets]).to(device)  # all processes':
    skipped = accelerator.reduce(marks.int(), reduction="sum").nonzero().flatten().tolist()
    accuracies = progress["eval_accuracies"]
    if accelerator.is_main_process:
        (args.output_dir / "metrics.json").write_text(json.dumps({
            "eval_accuracy": accuracies[-1], "eval_accuracy_per_epoch": accuracies,
            "device": device.type, "mixed_precision": accelerator.mixed_precision,
            "num_processes": processes, "train_images": len(train_set),
            "eval_images": len(eval_set), "global_step": progress["global_step"],
            "skipped_images": [str((train_set + eval_set)[i][0]) for i in skipped]}, indent=2))
        print(f"{PROG}: eval accuracy {accuracies[-1]:.4f}; {len(skipped)} unreadable image(s) "
              f"skipped; wrote {args.output_dir}/model and metrics.json")
    accelerator.end_training()  # ends the trackers; several processes leave their group
    return 0


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # instead of printing the usage and exiting
        raise InputError(message)


def parse_args(argv: list[str] | None = None):
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add("--data_dir", type=Path, required=True, help="Label_Name_123.jpg files or class folders")
    add("--output_dir", type=Path, default=Path("outputs", PROG), help="for the results")
    add("--model", default="resnet18", help="a torchvision classifier")
    add("--num_epochs", type=int, default=3, help="epochs")
    add("--batch_size", type=int, default=64, help="per process")
    add("--image_size", type=int, default=224, help="pixels a side")
    add("--lr", type=float, default=3e-3, help="peak learning rate")
    add("--num_workers", type=int, help="per process (by default 0 on the CPU, else the CPUs)")
    add("--seed", type=int, default=42, help="fixes the split, the weights, the augmentation")
    add("--cpu", action="store_true", help="Accelerator(cpu=True), else the launcher's choice")
    add("--mixed_precision", choices=("no", "fp16", "bf16"), help="else the launcher's choice")
    add("--checkpointing_steps", metavar="epoch|N", help="save after every epoch or N steps")
    add("--resume_from_checkpoint", metavar="PATH|latest", help="a checkpoint, or the latest one")
    args = parser.parse_args(argv)
    for name in ("num_epochs", "batch_size", "image_size", "lr"):
        if not getattr(args, name) > 0:
            raise InputError(f"--{name} must be more than 0, got {getattr(args, name)}")
    if (args.num_workers or 0) < 0:
        raise InputError(f"--num_workers must be 0 or more, got {args.num_workers}")
    if not re.fullmatch(r"epoch|[1-9][0-9]*", args.checkpointing_steps or "epoch"):
        raise InputError("--checkpointing_steps is epoch or a number of steps, not "
                         f"{args.checkpointing_steps!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        return train(parse_args(argv))
    except InputError as error:
        if os.environ.get("RANK", "0") == "0":  # every process finds it; the first one says it
            print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C
        print(f"{PROG}: stopped without a checkpoint", file=sys.stderr)
        return 128 + signal.SIGINT
    except Exception:  # dropped after printing: its traceback holds the DataLoader workers,
        traceback.print_exc()  # which ignore SIGTERM, so the exit would wait for them
        return 1


if __name__ == "__main__":
    sys.exit(main())
