"""examples/cv_example.py plus what a long run needs: checkpoints, resuming, a clean stop.

    python examples/make_demo_images.py images
    mpslaunch launch examples/complete_cv_example.py --data_dir images --image_size 64 \\
        --checkpointing_steps epoch
    mpslaunch launch examples/complete_cv_example.py --data_dir images --image_size 64 \\
        --resume_from_checkpoint latest          # after a stop: continue where it was

The data, the model and the step come from cv_example.py, beside this file (read it first).
This script adds:
  * `--checkpointing_steps epoch|N`: Accelerate's save_state (model, optimizer, schedule, random
    states, the position in training) to `--output_dir`/checkpoints/step_<global step>;
  * `--resume_from_checkpoint PATH|latest` continues at that step, mid-epoch too, and ends with
    the very weights of an uninterrupted run: the shuffle and every image's augmentation depend
    only on (seed, epoch, image), never on which worker or process loads it;
  * SIGTERM or Ctrl-C finishes the step, saves a checkpoint and exits with 128 + the signal
    number (143, 130); a second Ctrl-C stops at once. Several processes stop at the same step;
  * an image that does not decode is skipped, counted and named, never a crash;
  * a save that finds the disk full stops the run with one line and exit code 1 (bad input is
    2): what it wrote is removed, the checkpoints before it stay as they were;
  * the trained weights go to `--output_dir`/model.safetensors, the results to metrics.json.
"""

from __future__ import annotations

import atexit
import errno
import json
import multiprocessing
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import Sampler
from tqdm.auto import tqdm

import cv_example  # beside this file: Python puts a script's folder on sys.path
from cv_example import (ImageFiles, InputError, Normalize, UnreadableImage, build_model,
                        check_batch_size, find_images, make_loader, make_optimizer,
                        progress_bar)

PROG = "complete_cv_example"
UNREADABLE = -100  # the label of an image that did not decode: cross_entropy's ignore_index


class SeededImageFiles(ImageFiles):
    """cv_example's ImageFiles, items (image, label, index). A training item is (index, seed):
    the seed alone draws the image's augmentation. An image that does not decode comes back
    blank, labelled UNREADABLE."""

    def __getitem__(self, item):
        index, seed = item if isinstance(item, tuple) else (item, None)
        # The CPU generator only (all of them would start CUDA or MPS in each worker), and
        # restored after: in the training process it also drives dropout.
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.random.default_generator.manual_seed(seed)
            try:
                image, label = super().__getitem__(index)
            except UnreadableImage:
                blank = torch.zeros(3, self.image_size, self.image_size, dtype=torch.uint8)
                return blank, UNREADABLE, index
        return image, label, index


class EpochShuffle(Sampler):
    """(index, augmentation seed) pairs in an order drawn from (seed, epoch) alone."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        return iter(zip(order, torch.randint(2**62, (self.size,), generator=generator).tolist()))


def ignore_stop_signals(_worker_id: int) -> None:
    """DataLoader workers leave Ctrl-C and SIGTERM to the training process, which saves."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def end_workers() -> None:
    """At exit, multiprocessing stops the workers still running with SIGTERM, which they ignore,
    then waits for them: after a failure that leaves a loader alive (in its traceback), for ever.
    Registered after torch imported multiprocessing, this runs first and ends them."""
    for worker in multiprocessing.active_children():
        worker.kill()


def train_step(accelerator, model, optimizer, scheduler, normalize, images, labels):
    """cv_example's step, on the readable images only; the loss stays on the device."""
    loss = torch.nn.functional.cross_entropy(model(normalize(images)), labels, reduction="sum",
                                             ignore_index=UNREADABLE)
    loss = loss / (labels != UNREADABLE).sum().clamp_min(1)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


@dataclass
class Position:
    """Where training is; saved in every checkpoint (register_for_checkpointing)."""
    epoch: int = 0  # epochs done
    step_in_epoch: int = 0
    global_step: int = 0
    eval_accuracies: list[float] = field(default_factory=list)

    def state_dict(self) -> dict:
        return dict(vars(self))

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(state)


def latest_checkpoint(output_dir: Path) -> Path | None:
    steps = sorted((output_dir / "checkpoints").glob("step_*[0-9]"))
    return steps[-1] if steps else None  # zero-padded names sort by step


class DiskFull(Exception):
    """A save that did not fit: reported in one line, exit code 1."""


def size_of(path: Path) -> int:
    files = path.rglob("*") if path.is_dir() else [path] if path.exists() else []
    return sum(file.stat().st_size for file in files if file.is_file())


def ran_out_of_space(error: BaseException | None, written: int, free: int) -> bool:
    """Whether a failed save filled the disk (torch.save says only "unexpected pos"); `free`
    counts the space again that its `written` bytes took."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error = error.__cause__ or error.__context__
    return free - written < 2**20  # it stopped within a megabyte of a full disk


def undo_failed_save(error: Exception, path: Path, what: str, like: Path | None) -> None:
    """Removes what a failed save wrote to `path`; DiskFull if it ran out of space. `like`: a
    complete save of the same state, whose size it needs."""
    written = size_of(path)
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    free = shutil.disk_usage(next(folder for folder in path.parents if folder.exists())).free
    if ran_out_of_space(error, written, free):
        needs = f"needs about {size_of(like) / 1e6:,.1f} MB and {free / 1e6:,.1f} MB are free" \
            if like else f"needs more than the {free / 1e6:,.1f} MB free"
        kept = f"; {like} is intact" if like else ""
        raise DiskFull(f"the disk is full: {what} in {path.parent} {needs}; make room or choose "
                       f"another --output_dir{kept}") from None


class StopRequest:
    """SIGTERM and Ctrl-C set a flag; the loop finishes its step, saves and exits. The signal
    module keeps this object until exit, so it holds no accelerator (which holds the loaders)."""

    def __init__(self, accelerator: Accelerator):
        self.processes, self.signal_number, self.cpu_group = accelerator.num_processes, None, None
        # Processes on one machine agree over a CPU (gloo) group: no wait for the device at
        # each step. Across machines, where gloo may not reach, over Accelerate's trigger.
        one_machine = accelerator.num_processes == int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if accelerator.num_processes > 1 and one_machine:
            self.cpu_group = torch.distributed.group.WORLD \
                if torch.distributed.get_backend() == "gloo" \
                else torch.distributed.new_group(backend="gloo")
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, self.handle)

    def handle(self, number, _frame) -> None:
        if number == signal.SIGINT == self.signal_number:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
        self.signal_number = number

    def agreed(self, a: Accelerator) -> bool:
        """Whether to stop now: all processes stop at the same step if any was signalled."""
        signalled = self.signal_number is not None
        if self.processes == 1:
            return signalled
        if self.cpu_group is None:
            if signalled:
                a.set_trigger()
            return a.check_trigger()
        flag = torch.tensor([int(signalled)])
        torch.distributed.all_reduce(flag, group=self.cpu_group)
        return bool(flag.item())


class Training:
    """The run: set up once, then epochs of steps, evaluations and checkpoints."""

    def __init__(self, args):
        self.args = args
        classes, train_set, eval_set = find_images(args.data_dir, args.seed)
        set_seed(args.seed)
        model = build_model(args.model, len(classes), args.pretrained)
        check_batch_size(args, len(train_set))
        self.checkpoint = None
        if args.resume_from_checkpoint == "latest":
            self.checkpoint = latest_checkpoint(args.output_dir)
        elif args.resume_from_checkpoint is not None:
            self.checkpoint = Path(args.resume_from_checkpoint)
            if not self.checkpoint.is_dir():
                raise InputError(f"--resume_from_checkpoint {self.checkpoint}: no such "
                                 "checkpoint folder")
        self.accelerator = a = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision)
        self.normalize = Normalize(a.device)
        model = model.to(memory_format=self.normalize.memory_format)
        self.train_set = SeededImageFiles(train_set, args.image_size, train=True)
        self.eval_set = SeededImageFiles(eval_set, args.image_size, train=False)
        self.sampler = EpochShuffle(len(self.train_set), args.seed)
        # The loaders' own generators: starting an epoch must not draw from the training's
        # random state, or a resumed run would drift from an uninterrupted one.
        options = dict(worker_init_fn=ignore_stop_signals, generator=torch.Generator())
        train_loader = make_loader(self.train_set, args, a.device, sampler=self.sampler,
                                   drop_last=True, **options)
        eval_loader = make_loader(self.eval_set, args, a.device, **options)
        # Steps counted before prepare() shares the batches out: each process steps the schedule.
        optimizer, scheduler = make_optimizer(model, args.lr, args.num_epochs * len(train_loader))
        (self.model, self.optimizer, self.scheduler, self.train_loader,
         self.eval_loader) = a.prepare(model, optimizer, scheduler, train_loader, eval_loader)
        self.position = Position()
        a.register_for_checkpointing(self.position)
        # Which images did not decode, marked by any process (on the device: no waiting).
        self.unreadable = [torch.zeros(len(dataset), dtype=torch.bool, device=a.device)
                           for dataset in (self.train_set, self.eval_set)]
        self.stop = StopRequest(a)
        a.print(f"{PROG}: {len(train_set)} train / {len(eval_set)} eval images, "
                f"{len(classes)} classes; {args.model} on {a.device.type}, mixed precision "
                f"{a.mixed_precision}, {a.num_processes} process(es)")

    def resume(self) -> None:
        if self.checkpoint is None:
            if self.args.resume_from_checkpoint == "latest":
                self.warn(f"no checkpoint in {self.args.output_dir / 'checkpoints'} yet; "
                          "starting from the beginning")
            return
        try:
            self.accelerator.load_state(str(self.checkpoint))
        except (RuntimeError, ValueError, KeyError, FileNotFoundError) as error:
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise InputError(f"cannot resume from {self.checkpoint}: it does not match this run "
                             f"(model, classes or options): {first_line}") from None
        self.accelerator.print(f"{PROG}: resumed from {self.checkpoint} at epoch "
                               f"{self.position.epoch + 1}, step {self.position.global_step}")

    def run(self) -> int:
        """All epochs; returns the exit code: 0, or 128 + N after signal N."""
        for epoch in range(self.position.epoch, self.args.num_epochs):
            trained = self.train_epoch(epoch)
            if trained is None:
                return self.save_and_stop()
            self.position.epoch, self.position.step_in_epoch = epoch + 1, 0
            accuracy = self.evaluate()
            self.accelerator.print(f"{PROG}: epoch {epoch + 1}/{self.args.num_epochs}: loss "
                                   f"{trained[0]:.3f}, {trained[1]:,.0f} training images/s, "
                                   f"eval accuracy {accuracy:.4f}")
            self.warn_about_skipped_images()
            if self.args.checkpointing_steps == "epoch":
                self.save_checkpoint()
            if self.stop.agreed(self.accelerator):
                return self.save_and_stop()
        self.finish()
        return 0

    def train_epoch(self, epoch: int) -> tuple[float, float] | None:
        """One pass over the training set from the current position: the mean loss and the
        images/s of its steps in this run, or None if a stop was agreed."""
        a, position, every = self.accelerator, self.position, self.args.checkpointing_steps
        self.sampler.set_epoch(epoch)
        self.train_loader.set_epoch(epoch)
        loader = a.skip_first_batches(self.train_loader, position.step_in_epoch) \
            if position.step_in_epoch else self.train_loader
        images_per_step = self.train_loader.total_batch_size  # all processes' batches
        bar = progress_bar(a, f"epoch {epoch + 1}/{self.args.num_epochs}",
                           len(self.train_loader) * images_per_step,
                           done=position.step_in_epoch * images_per_step)
        started, loss_sum, steps = time.perf_counter(), torch.zeros((), device=a.device), 0
        for images, labels, indices in loader:
            loss_sum += train_step(a, self.model, self.optimizer, self.scheduler,
                                   self.normalize, images, labels)
            self.unreadable[0][indices] = labels == UNREADABLE
            steps += 1
            position.step_in_epoch += 1
            position.global_step += 1
            if bar.update(images_per_step):  # True when it redraws: reading the loss waits
                bar.set_postfix(loss=f"{loss_sum.item() / steps:.3f}", refresh=False)
            if isinstance(every, int) and position.global_step % every == 0:
                self.save_checkpoint()
            if self.stop.agreed(a):
                bar.close()
                return None
        bar.close()
        mean_loss = a.reduce(loss_sum, reduction="mean").item() / max(1, steps)
        return mean_loss, steps * images_per_step / (time.perf_counter() - started)

    @torch.no_grad()
    def evaluate(self) -> float:
        """The accuracy on the evaluation images that decode."""
        a, model = self.accelerator, self.model
        model.eval()
        correct = total = 0
        for images, labels, indices in self.eval_loader:
            self.unreadable[1][indices] = labels == UNREADABLE  # skipped_images() adds them up
            predictions = model(self.normalize(images)).argmax(dim=1)
            # All processes' predictions, less the samples repeated to fill the last batch.
            predictions, labels = a.gather_for_metrics((predictions, labels))
            correct += (predictions == labels).sum()  # never for UNREADABLE: no class is -100
            total += (labels != UNREADABLE).sum()
        model.train()
        self.position.eval_accuracies.append(int(correct) / max(1, int(total)))
        return self.position.eval_accuracies[-1]

    def warn_about_skipped_images(self) -> None:
        skipped = self.skipped_images()
        if skipped:
            names = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more"
                                              if len(skipped) > 3 else "")
            self.warn(f"skipped {len(skipped)} image(s) that could not be decoded: {names}")

    def skipped_images(self) -> list[str]:
        """The files found unreadable so far, by any process."""
        found = []
        for marks, dataset in zip(self.unreadable, (self.train_set, self.eval_set)):
            marked = self.accelerator.reduce(marks.int(), reduction="sum")
            found += [str(dataset.samples[i][0]) for i in marked.nonzero().flatten().tolist()]
        return found

    def save_checkpoint(self) -> Path:
        """save_state into step_N.partial, then a rename: a killed save never looks complete,
        a failed one is removed (DiskFull if the disk is full)."""
        a = self.accelerator
        final = self.args.output_dir / "checkpoints" / f"step_{self.position.global_step:08d}"
        if not final.exists():  # already saved at this step (then a signal came)
            partial = final.with_name(final.name + ".partial")
            try:
                a.save_state(str(partial))
            except Exception as error:
                undo_failed_save(error, partial, "a checkpoint",
                                 latest_checkpoint(self.args.output_dir))
                raise
            a.wait_for_everyone()
            if a.is_main_process:
                partial.rename(final)
            a.wait_for_everyone()
        return final

    def save_and_stop(self) -> int:
        checkpoint = self.save_checkpoint()
        self.accelerator.print(f"{PROG}: stopped at step {self.position.global_step} by a "
                               f"signal; checkpoint saved to {checkpoint}; continue with "
                               "--resume_from_checkpoint latest")
        self.accelerator.end_training()
        return 128 + (self.stop.signal_number or signal.SIGTERM)  # SIGTERM: another's

    def finish(self) -> None:
        a, args, position = self.accelerator, self.args, self.position
        a.wait_for_everyone()
        try:
            a.save_model(self.model, args.output_dir)  # model.safetensors
        except Exception as error:
            undo_failed_save(error, args.output_dir / "model.safetensors", "the trained model",
                             None)
            raise
        metrics = {"eval_accuracy": position.eval_accuracies[-1],
                   "eval_accuracy_per_epoch": position.eval_accuracies,
                   "device": a.device.type, "mixed_precision": a.mixed_precision,
                   "num_processes": a.num_processes, "model": args.model,
                   "image_size": args.image_size, "batch_size": args.batch_size,
                   "train_images": len(self.train_set), "eval_images": len(self.eval_set),
                   "epochs": position.epoch, "global_step": position.global_step,
                   "skipped_images": len(self.skipped_images())}
        if a.is_main_process:
            (args.output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
            a.print(f"{PROG}: eval accuracy {metrics['eval_accuracy']:.4f}; wrote "
                    f"{args.output_dir / 'metrics.json'} and model.safetensors")
        a.end_training()

    def warn(self, message: str) -> None:
        if self.accelerator.is_main_process:
            tqdm.write(f"{PROG}: warning: {message}", file=sys.stderr)


def checkpointing_steps(text: str) -> str | int:
    if text == "epoch":
        return text
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ValueError(text)  # argparse: "invalid checkpointing_steps value: ..."


def parse_args(argv: list[str] | None = None):
    parser = cv_example.make_parser(PROG, __doc__)
    parser.add_argument("--checkpointing_steps", type=checkpointing_steps, metavar="epoch|N",
                        help="save a checkpoint after every epoch or every N steps")
    parser.add_argument("--resume_from_checkpoint", metavar="PATH|latest",
                        help="a checkpoint folder, or the latest in --output_dir/checkpoints")
    return cv_example.parse_args(argv, parser)


def main(argv: list[str] | None = None) -> int:
    main_rank = os.environ.get("RANK", "0") == "0"  # torchrun's: one process reports bad input
    atexit.register(end_workers)
    try:
        args = parse_args(argv)
        training = Training(args)  # bad input is found before the device is touched
        training.resume()
        args.output_dir.mkdir(parents=True, exist_ok=True)
        return training.run()
    except InputError as error:
        if main_rank:
            print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except DiskFull as error:  # in the process that saved
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C
        print(f"{PROG}: stopped without a checkpoint", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
