"""Checkpoints and signals: the position in training, saving and finding checkpoints, writing
results by rename, and the stop that SIGTERM/SIGINT request."""

from __future__ import annotations

import functools
import os
import re
import signal
from pathlib import Path

import torch

from .cli import InputError


class TrainingPosition:
    """Where training is; saved with each checkpoint (Accelerate's register_for_checkpointing)."""

    def __init__(self):
        self.epoch = 0            # epochs completed
        self.step_in_epoch = 0    # optimizer steps done in the current epoch
        self.global_step = 0
        self.eval_accuracies: list[float] = []

    def state_dict(self) -> dict:
        return dict(epoch=self.epoch, step_in_epoch=self.step_in_epoch,
                    global_step=self.global_step, eval_accuracies=list(self.eval_accuracies))

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.step_in_epoch = state["epoch"], state["step_in_epoch"]
        self.global_step, self.eval_accuracies = state["global_step"], state["eval_accuracies"]


CHECKPOINT_NAME = re.compile(r"^step_(\d+)$")


def checkpoint_dir(output_dir: Path, global_step: int) -> Path:
    return output_dir / "checkpoints" / f"step_{global_step:08d}"


def latest_checkpoint(output_dir: Path) -> Path | None:
    folder = output_dir / "checkpoints"
    if not folder.is_dir():
        return None
    found = [p for p in folder.iterdir() if CHECKPOINT_NAME.match(p.name)]
    return max(found, key=lambda p: int(CHECKPOINT_NAME.match(p.name)[1]), default=None)


def checkpoint_to_resume(args) -> Path | None:
    if args.resume_from_checkpoint is None:
        return None
    if args.resume_from_checkpoint == "latest":
        return latest_checkpoint(args.output_dir)
    path = Path(args.resume_from_checkpoint)
    if not path.is_dir():
        raise InputError(f"--resume_from_checkpoint {path}: no such checkpoint folder")
    return path


def write_replacing(path: Path, text: str) -> None:
    """Write beside `path`, then rename over it: a crash never leaves half a file, and a symlink
    planted at `path` is replaced, never followed. The file gets the user's umask."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(descriptor, "w") as stream:
        stream.write(text)
    os.replace(temporary, path)


def save_model_replacing(accelerator, model, output_dir: Path) -> None:
    """Accelerate's save_model into a fresh folder, then each file renamed into output_dir
    (same reason as write_replacing)."""
    staging = output_dir / f".model.{os.getpid()}.tmp"
    staging.mkdir()
    try:
        accelerator.save_model(model, str(staging))
        for saved in staging.iterdir():
            os.replace(saved, output_dir / saved.name)
    finally:
        for left in staging.iterdir():
            left.unlink()
        staging.rmdir()


def save_checkpoint(accelerator, output_dir: Path, global_step: int) -> Path:
    """save_state into step_N.partial, then rename: a killed save never looks complete."""
    final = checkpoint_dir(output_dir, global_step)
    if final.exists():  # e.g. the step checkpoint was just written and then a signal came
        return final
    partial = final.with_name(final.name + ".partial")
    accelerator.save_state(str(partial))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        partial.rename(final)
    accelerator.wait_for_everyone()
    return final


class StopRequest:
    """SIGTERM/SIGINT set a flag; the training loop finishes its step, saves and exits."""

    def __init__(self):
        self.signal_number: int | None = None

    def install(self) -> None:
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signal_number, self._handle)

    def _handle(self, signal_number, _frame) -> None:
        if self.signal_number == signal.SIGINT and signal_number == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
        self.signal_number = signal_number

    def agreed(self, accelerator) -> bool:
        """Whether to stop now; with several processes, all of them stop at the same step.

        On one machine they agree over a CPU (gloo) group: Accelerate's check_trigger reduces a
        tensor on the device and reads it back, a wait for the GPU at every step that keeps the
        training loop from queueing work ahead of it. Across machines, where gloo may not reach
        the other hosts, check_trigger it is."""
        if accelerator.num_processes == 1:
            return self.signal_number is not None
        group = self.local_cpu_group
        if group is None:
            if self.signal_number is not None:
                accelerator.set_trigger()
            return accelerator.check_trigger()
        flag = torch.tensor([int(self.signal_number is not None)])
        torch.distributed.all_reduce(flag, group=group)
        return bool(flag.item())

    @functools.cached_property
    def local_cpu_group(self):
        """A gloo group of all processes when they share this machine (made once, at the first
        check, which every process reaches at the same step), else None."""
        dist = torch.distributed
        if dist.get_world_size() != int(os.environ.get("LOCAL_WORLD_SIZE", "0")):
            return None
        if dist.get_backend() == "gloo":
            return dist.group.WORLD
        return dist.new_group(backend="gloo")

    def exit_code(self) -> int:
        return 128 + (self.signal_number or signal.SIGTERM)
