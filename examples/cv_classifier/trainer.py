"""The training loop: the Accelerator, and the Trainer that runs the phases (loaders, resume,
epochs, evaluation, checkpoints, metrics)."""

from __future__ import annotations

import json
import sys
import time

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import AutocastKwargs, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from .checkpoints import (StopRequest, TrainingPosition, checkpoint_to_resume, save_checkpoint,
                          save_model_replacing, write_replacing)
from .cli import PROG, InputError, first_line
from .data import (UNREADABLE, EpochShuffle, ImageFiles, Targets, collate_decoded,
                   default_num_workers, eval_transform, make_loader, train_transform)
from .gpu_decode import (GPU_DECODE_WORKERS, DecodeAhead, EncodedBatch, JpegBatchDecoder,
                         choose_decode, collate_encoded, make_image_cache)
from .images import split_train_eval
from .model import (GraphedTrainStep, Normalizer, build_model, evaluate, make_optimizer,
                    make_train_step, memory_format_for)
from .startup import STARTUP, process_start_time


def make_accelerator(args) -> Accelerator:
    options = {}
    if args.cpu:
        options["cpu"] = True
    if args.mixed_precision is not None:
        options["mixed_precision"] = args.mixed_precision
    # A CUDA graph cannot hold autocast's cache of cast weights (freed after the capture).
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(),
                              kwargs_handlers=[AutocastKwargs(cache_enabled=False)], **options)
    # Asynchronous host->device copies pay off from pinned memory, which only CUDA uses.
    accelerator.dataloader_config.non_blocking = accelerator.device.type == "cuda"
    return accelerator


def warn(accelerator, message: str) -> None:
    if accelerator is None or accelerator.is_main_process:
        tqdm.write(f"{PROG}: warning: {message}", file=sys.stderr)


def describe_paths(paths: list) -> str:
    names = ", ".join(str(p) for p in paths[:3])
    return names + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


class WaitClock:
    """Adds up the time an iteration spends waiting for its next item."""

    def __init__(self):
        self.seconds = 0.0

    def timed(self, iterable):
        items = iter(iterable)
        try:
            while True:
                asked = time.perf_counter()
                try:
                    item = next(items)
                except StopIteration:
                    return
                self.seconds += time.perf_counter() - asked
                yield item
        finally:  # a loop left early stops the decode thread now, not when collected
            getattr(items, "close", lambda: None)()


class Trainer:
    """Holds what the training loop needs; one method per phase."""

    def __init__(self, args, accelerator, samples, skipped_files):
        self.args, self.accelerator = args, accelerator
        self.device = accelerator.device
        self.skipped_files = list(skipped_files)
        self.undecodable_files: set[str] = set()
        train_loader, eval_loader = self.make_loaders(samples)
        set_seed(args.seed)
        model = build_model(args.model, self.num_classes, args.pretrained)
        self.memory_format = memory_format_for(self.device)
        model = model.to(memory_format=self.memory_format)
        # Counted in global steps before prepare(); Accelerate steps the schedule once per
        # process at each step, so it ends on time with any number of processes.
        optimizer, scheduler = make_optimizer(model, args.lr,
                                              args.num_epochs * len(train_loader), self.device)
        (self.model, self.optimizer, self.scheduler, self.train_loader,
         self.eval_loader) = accelerator.prepare(model, optimizer, scheduler, train_loader,
                                                 eval_loader)
        self.normalize = Normalizer(self.device, self.memory_format)
        self.step = make_train_step(accelerator, self.model, self.optimizer, self.scheduler,
                                    self.normalize, cuda_graph=not args.no_cuda_graph,
                                    warn=lambda message: warn(accelerator,
                                                              f"{args.model}: {message}"))
        self.position = TrainingPosition()
        accelerator.register_for_checkpointing(self.position)
        self.stop = StopRequest()
        self.train_seconds = 0.0
        self.images_trained = 0
        self.epoch_rates: list[float] = []  # images/s of each epoch run in this process
        self.data_waits: list[float] = []  # per epoch: seconds the loop waited for a batch
        self.first_step_finished_at: float | None = None
        self.first_step = (0.0, 0)  # (seconds from the epoch's start, images) when run here

    def make_loaders(self, samples) -> tuple[DataLoader, DataLoader]:
        args = self.args
        classes = sorted({label for _, label in samples})
        class_index = {label: i for i, label in enumerate(classes)}
        self.num_classes = len(classes)
        train, evals = split_train_eval([(p, class_index[label]) for p, label in samples],
                                        args.seed)
        self.decode = choose_decode(args.decode, self.device, [str(p) for p, _ in train])
        gpu_decode = self.decode == "gpu"
        self.image_cache = make_image_cache(len(train), args.image_cache_gb, self.device) \
            if gpu_decode else None
        self.jpeg_decoder = JpegBatchDecoder(self.device, args.image_size, self.image_cache) \
            if gpu_decode else None
        self.decode_stream = torch.cuda.Stream(self.device) \
            if gpu_decode and self.device.type == "cuda" else None
        self.train_set = ImageFiles(
            train, train_transform(args.image_size), args.image_size, encoded=gpu_decode,
            cached_sizes=self.image_cache.sizes if self.image_cache is not None else None)
        self.eval_set = ImageFiles(evals, eval_transform(args.image_size), args.image_size)
        self.sampler = EpochShuffle(len(self.train_set), args.seed)
        workers = args.num_workers
        if workers is None:
            workers = default_num_workers(self.device)
        # Reading files and drawing crops is little work: a few workers keep up, and the cores
        # stay free for the training loop, which now decodes too.
        train_workers = min(workers, GPU_DECODE_WORKERS) if gpu_decode and \
            args.num_workers is None else workers
        pin = self.device.type == "cuda"
        # drop_last: every training batch has one shape, and BatchNorm never gets a batch of 1.
        train_loader = make_loader(self.train_set, args.batch_size, train_workers, pin,
                                   sampler=self.sampler, drop_last=True,
                                   collate_fn=collate_encoded if gpu_decode else collate_decoded)
        return train_loader, make_loader(self.eval_set, args.batch_size, workers, pin)

    def training_batches(self, loader):
        """The loader's batches as (images, labels, indices) on the device (--decode gpu:
        decoded, then cropped, ahead)."""
        if self.jpeg_decoder is None:
            return ((images, *targets.on(self.device)) for images, targets in loader)
        return DecodeAhead(loader, [self.decode_batch, self.prepare_batch], self.device,
                           self.decode_stream)

    def decode_batch(self, batch: EncodedBatch) -> tuple:
        """--decode gpu, first stage: the batch and its JPEGs decoded (or recalled)."""
        return (batch, *self.jpeg_decoder.decode_or_recall(batch))

    def prepare_batch(self, decoded: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """--decode gpu, second stage: images, labels and indices on the device; images that
        did not decode are blank and labelled UNREADABLE."""
        batch = decoded[0]
        images, failed = self.jpeg_decoder.crop(*decoded)
        return (images,
                *Targets(batch.labels, batch.indices).on(self.device, unreadable=failed))

    # -- phases

    def resume(self) -> None:
        checkpoint = checkpoint_to_resume(self.args)
        if checkpoint is None:
            if self.args.resume_from_checkpoint == "latest":
                warn(self.accelerator, f"no checkpoint in {self.args.output_dir / 'checkpoints'}"
                     "; starting from the beginning")
            return
        try:
            self.accelerator.load_state(str(checkpoint))
        except (RuntimeError, ValueError, KeyError, FileNotFoundError) as error:
            raise InputError(f"cannot resume from {checkpoint}: it does not match this run "
                             f"(model, classes or options): {first_line(error)}") from None
        self.accelerator.print(f"{PROG}: resumed from {checkpoint} at epoch "
                               f"{self.position.epoch + 1}, step {self.position.global_step}")

    def run(self) -> int:
        """Train all epochs; returns the exit code (0, or 128+N after a stop signal)."""
        self.stop.install()
        for epoch in range(self.position.epoch, self.args.num_epochs):
            if not self.train_one_epoch(epoch):
                return self.save_and_stop()
            self.position.epoch, self.position.step_in_epoch = epoch + 1, 0
            self.evaluate_epoch(epoch)
            if self.args.checkpointing_steps == "epoch":
                save_checkpoint(self.accelerator, self.args.output_dir, self.position.global_step)
            if self.stop.agreed(self.accelerator):
                return self.save_and_stop()
        self.finish()
        return 0

    def announce(self) -> None:
        a = self.accelerator
        a.print(f"{PROG}: {len(self.train_set)} train / {len(self.eval_set)} eval images, "
                f"{self.num_classes} classes; {self.args.model} on {self.device.type} "
                f"(mixed precision {a.mixed_precision}, {a.num_processes} process(es), "
                f"batch {self.args.batch_size} per process, JPEGs decoded on the {self.decode})")
        if self.skipped_files:
            warn(a, f"skipped {len(self.skipped_files)} file(s) that are not JPEG or PNG images: "
                    f"{describe_paths(self.skipped_files)}")

    def train_one_epoch(self, epoch: int) -> bool:
        """False when a stop signal came (the position then points after the last step done)."""
        a, args = self.accelerator, self.args
        self.sampler.set_epoch(epoch)
        self.train_loader.set_epoch(epoch)
        steps = len(self.train_loader)
        loader = self.train_loader
        if self.position.step_in_epoch:
            loader = a.skip_first_batches(self.train_loader, self.position.step_in_epoch)
        bar = tqdm(total=steps, initial=self.position.step_in_epoch, disable=not a.is_main_process,
                   desc=f"epoch {epoch + 1}/{args.num_epochs}", unit="step", dynamic_ncols=True)
        unreadable = torch.zeros(len(self.train_set), dtype=torch.bool, device=self.device)
        started, images, loss, shown_at = time.perf_counter(), 0, None, 0.0
        stopped = False
        waits = WaitClock()
        for batch_images, labels, indices in waits.timed(self.training_batches(loader)):
            STARTUP.mark("first_batch_on_device")
            loss = self.step(batch_images, labels)
            unreadable[indices] = labels == UNREADABLE  # no host sync
            images += batch_images.shape[0] * a.num_processes
            self.position.step_in_epoch += 1
            self.position.global_step += 1
            if self.first_step_finished_at is None:
                loss.item()  # wait for the device, so the time is honest
                self.first_step_finished_at = time.time()
                STARTUP.mark("first_step_done")
                # The first step is start-up (loading kernels, choosing algorithms, the first
                # batch): reported as time_to_first_step_s, the rates count from its end.
                self.first_step = (time.perf_counter() - started, images)
                started, images, waits.seconds = time.perf_counter(), 0, 0.0
            bar.update(1)
            if time.perf_counter() - shown_at > 1.0:  # reading the loss syncs: not every step
                shown_at = time.perf_counter()
                bar.set_postfix(loss=f"{loss.item():.3f}",
                                img_s=f"{images / (shown_at - started):,.0f}")
            if self.step_checkpoint_due():
                save_checkpoint(a, args.output_dir, self.position.global_step)
            if self.stop.agreed(a):
                stopped = True
                break
        if loss is not None:
            loss.item()
        seconds = time.perf_counter() - started
        self.train_seconds += seconds
        self.images_trained += images
        self.epoch_rates.append(images / seconds)
        self.data_waits.append(waits.seconds)
        bar.close()
        self.report_unreadable(self.train_set, unreadable, "training")
        return not stopped

    @property
    def cuda_graph(self) -> bool:
        return isinstance(self.step, GraphedTrainStep) and self.step.graph is not None

    def step_checkpoint_due(self) -> bool:
        every = self.args.checkpointing_steps
        return isinstance(every, int) and self.position.global_step % every == 0

    def evaluate_epoch(self, epoch: int) -> None:
        accuracy, unreadable = evaluate(self.accelerator, self.model, self.normalize,
                                        self.eval_loader)
        self.position.eval_accuracies.append(accuracy)
        if len(unreadable):
            self.warn_unreadable(self.eval_set, unreadable.tolist(), "eval")
        rate = self.images_trained / max(self.train_seconds, 1e-9)
        self.accelerator.print(f"{PROG}: epoch {epoch + 1}: eval accuracy {accuracy:.4f} "
                               f"(training {rate:,.0f} images/s so far)")

    def report_unreadable(self, dataset, unreadable: torch.Tensor, where: str) -> None:
        unreadable = self.accelerator.reduce(unreadable.int(), reduction="sum")
        indices = unreadable.nonzero().flatten().tolist()
        if indices:
            self.warn_unreadable(dataset, indices, where)

    def warn_unreadable(self, dataset, indices: list[int], where: str) -> None:
        paths = [dataset.paths[i] for i in sorted(set(indices))]
        self.undecodable_files.update(paths)
        warn(self.accelerator, f"skipped {len(paths)} {where} image(s) that could not be decoded "
                               f"(corrupt or truncated): {describe_paths(paths)}")

    def save_and_stop(self) -> int:
        checkpoint = save_checkpoint(self.accelerator, self.args.output_dir,
                                     self.position.global_step)
        self.accelerator.print(f"{PROG}: stopped at step {self.position.global_step} by a signal; "
                               f"checkpoint saved to {checkpoint}; continue with "
                               "--resume_from_checkpoint latest")
        self.accelerator.end_training()
        return self.stop.exit_code()

    def finish(self) -> None:
        a = self.accelerator
        a.wait_for_everyone()
        save_model_replacing(a, self.model, self.args.output_dir)
        if a.is_main_process:
            metrics = self.metrics()
            write_replacing(self.args.output_dir / "metrics.json",
                            json.dumps(metrics, indent=2) + "\n")
            a.print(f"{PROG}: eval accuracy {metrics['eval_accuracy']:.4f}, "
                    f"{metrics['train_images_per_second']:,.0f} training images/s; "
                    f"wrote {self.args.output_dir / 'metrics.json'}")
        a.end_training()

    def metrics(self) -> dict:
        a, args, position = self.accelerator, self.args, self.position
        started = process_start_time()
        first = self.first_step_finished_at
        return {
            "eval_accuracy": position.eval_accuracies[-1] if position.eval_accuracies else None,
            "eval_accuracy_per_epoch": position.eval_accuracies,
            "epochs": position.epoch,
            "global_step": position.global_step,
            "train_images_per_second": self.images_trained / self.train_seconds
            if self.train_seconds else None,
            "train_images_per_second_with_first_step":
            (self.images_trained + self.first_step[1]) / (self.train_seconds + self.first_step[0])
            if self.train_seconds else None,
            "train_images_per_second_per_epoch": self.epoch_rates,
            # Time the loop stood waiting for the next batch: the pipeline's share of an epoch
            # (the device may still be busy with steps queued before).
            "data_wait_s_per_epoch": self.data_waits,
            "time_to_first_step_s": first - started if first and started else None,
            "first_step_finished_at": first,
            "startup_s": STARTUP.since(started),
            "device": self.device.type,
            "decode": self.decode,
            "cuda_graph": self.cuda_graph,
            "cached_images": len(self.image_cache.images) if self.image_cache else 0,
            "mixed_precision": a.mixed_precision,
            "num_processes": a.num_processes,
            "model": args.model,
            "image_size": args.image_size,
            "batch_size": args.batch_size,
            "train_images": len(self.train_set),
            "eval_images": len(self.eval_set),
            "skipped_images": len(self.skipped_files) + len(self.undecodable_files),
            "seed": args.seed,
        }
