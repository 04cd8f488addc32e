"""Where does cv_example's training process spend its time? torch.profiler over real steps.

Builds cv_example's own Trainer (the same code `mpslaunch launch examples/cv_example.py` runs)
on the benchmark's Pet-sized photos, trains two epochs, and profiles a window of steps in each:
the first epoch decodes every JPEG, the second reads the decoded-image cache (--decode gpu).
For each window it prints the busiest operators by CPU and by device time, and how busy each
thread of the process was; with --trace_dir it also writes Chrome traces (chrome://tracing).

    PYTHONPATH=src python3 benchmarks/cv_profile.py --decode gpu --trace_dir $OUT

--stages: no training and no profiler; the data pipeline alone for two epochs, with each
stage's time per batch (wall and its thread's CPU): waiting for the DataLoader workers, and,
with --decode gpu, the nvjpeg stage and the crop stage (each in its own thread).

    PYTHONPATH=src python3 benchmarks/cv_profile.py --decode gpu --stages

--waits: trains (no profiler) and tells where in each epoch the training loop waited for its
next batch: the first batch, all the others, and the five longest waits with their positions.

    PYTHONPATH=src python3 benchmarks/cv_profile.py --decode gpu --waits

Not a test and not a throughput number: the profiler slows every operator down. Use it to see
which thread and which operators compete with the training step; measure speed with
cv_throughput.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

from cv_throughput import example_args, import_cv_classifier, load_example, make_photos

DEFAULT_DATA = Path("/tmp/cv_throughput_data")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decode", default="gpu")
    parser.add_argument("--photos", type=int, default=4000)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--mixed_precision", default="no")
    parser.add_argument("--num_workers", type=int, default=None)
    parser.add_argument("--image_cache_gb", default=None)
    parser.add_argument("--no_cuda_graph", action="store_true")
    parser.add_argument("--first_step", type=int, default=20, help="window start, in each epoch")
    parser.add_argument("--steps", type=int, default=20, help="window length")
    parser.add_argument("--trace_dir", type=Path, default=None)
    parser.add_argument("--stages", action="store_true",
                        help="time the data pipeline's stages instead (no training)")
    parser.add_argument("--waits", action="store_true",
                        help="where in each epoch the training loop waits (no profiler)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--data_root", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args(argv)
    args.cpu = False
    return args


def thread_busy(profiler, seconds: float) -> str:
    """Share of the window each thread spent inside top-level operators."""
    spans = defaultdict(list)
    for event in profiler.events():
        if event.device_type.name == "CPU" and event.cpu_parent is None:
            spans[event.thread].append((event.time_range.start, event.time_range.end))
    lines = []
    for thread, ranges in sorted(spans.items()):
        busy, reach = 0, 0
        for start, end in sorted(ranges):  # union of intervals, in µs
            if end > reach:
                busy += end - max(start, reach)
                reach = end
        lines.append(f"  thread {thread}: {busy / 1e6 / seconds:6.1%} busy in operators "
                     f"({len(ranges)} top-level calls)")
    return "\n".join(lines)


class ProfiledWindow:
    """Wraps the training batches: profiles steps [first, first + count) of the epoch."""

    def __init__(self, args, epoch: int):
        self.args, self.epoch = args, epoch

    def wrap(self, batches):
        import torch
        from torch.profiler import ProfilerActivity, profile
        first, count = self.args.first_step, self.args.steps
        profiler, started = None, 0.0
        for step, batch in enumerate(batches):
            if step == first:
                profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                profiler.start()
                started = time.perf_counter()
            yield batch
            if step == first + count - 1:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - started
                profiler.stop()
                self.report(profiler, seconds)

    def report(self, profiler, seconds: float) -> None:
        args = self.args
        print(flush=True)
        print(f"==== epoch {self.epoch + 1}, steps {args.first_step}-"
              f"{args.first_step + args.steps - 1}: {seconds / args.steps * 1e3:.1f} ms a step "
              "under the profiler")
        print(thread_busy(profiler, seconds))
        averages = profiler.key_averages()
        print(averages.table(sort_by="self_cpu_time_total", row_limit=18,
                             max_name_column_width=55))
        print(averages.table(sort_by="self_cuda_time_total", row_limit=12,
                             max_name_column_width=55))
        if args.trace_dir:
            args.trace_dir.mkdir(parents=True, exist_ok=True)
            profiler.export_chrome_trace(str(args.trace_dir / f"epoch{self.epoch + 1}.json"))
        sys.stdout.flush()


class StageClock:
    """Per-batch wall and thread-CPU time of the functions it wraps, by name."""

    def __init__(self):
        self.totals: dict[str, list] = {}

    def add(self, name: str, wall: float, cpu: float) -> None:
        total = self.totals.setdefault(name, [0.0, 0.0, 0])
        total[0] += wall
        total[1] += cpu
        total[2] += 1

    def wrap(self, name: str, function):
        def timed(item):
            wall, cpu = time.perf_counter(), time.thread_time()
            result = function(item)
            self.add(name, time.perf_counter() - wall, time.thread_time() - cpu)
            return result
        return timed

    def report(self) -> str:
        return "\n".join(f"  {name}: {wall / count * 1e3:.2f} ms wall, {cpu / count * 1e3:.2f} ms "
                         f"of its thread's CPU, per batch ({count} batches)"
                         for name, (wall, cpu, count) in self.totals.items())


def stage_timings(trainer, epochs: int) -> None:
    import torch
    from cv_classifier.trainer import WaitClock
    clock = StageClock()
    if trainer.jpeg_decoder is not None:
        trainer.decode_batch = clock.wrap("nvjpeg stage (decode_batch)", trainer.decode_batch)
        trainer.prepare_batch = clock.wrap("crop stage (prepare_batch)", trainer.prepare_batch)
    loader = trainer.train_loader
    for epoch in range(epochs):
        clock.totals.clear()
        trainer.sampler.set_epoch(epoch)
        loader.set_epoch(epoch)
        started, images, batches = time.perf_counter(), 0, 0
        workers = WaitClock()  # taking batches from the loader (in the first stage's thread)
        for batch_images, _labels, _indices in trainer.training_batches(workers.timed(loader)):
            images += batch_images.shape[0]
            batches += 1
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        waiting = {"waiting for the DataLoader workers": [workers.seconds, 0.0, batches]}
        clock.totals = {**waiting, **clock.totals}  # reported first, as it comes first
        print(f"epoch {epoch + 1}: {images / seconds:,.0f} images/s, the data pipeline alone "
              f"({loader.num_workers} workers)\n{clock.report()}", flush=True)


def wait_positions(trainer, epochs: int) -> None:
    """Trains and evaluates `epochs` epochs, as cv_example does, recording each wait for a
    training batch (through the Trainer's WaitClock)."""
    from cv_classifier import trainer as trainer_module
    records = []

    class RecordingClock(trainer_module.WaitClock):
        def timed(self, iterable):
            waits = []
            records.append(waits)
            clock = time.perf_counter()
            for item in super().timed(iterable):
                waits.append(time.perf_counter() - clock)
                yield item
                clock = time.perf_counter()

    trainer_module.WaitClock = RecordingClock
    for epoch in range(epochs):
        trainer.train_one_epoch(epoch)
        trainer.position.step_in_epoch = 0  # as Trainer.run does between epochs
        trainer.evaluate_epoch(epoch)
        waits = records[-1]
        longest = sorted(range(len(waits)), key=lambda i: -waits[i])[:5]
        print(f"epoch {epoch + 1}: {trainer.epoch_rates[-1]:,.0f} images/s; waited "
              f"{waits[0] * 1e3:.1f} ms for the first batch, {sum(waits[1:]) * 1e3:.1f} ms for "
              f"batches 2-{len(waits)}; longest waits (batch, ms): "
              f"{[(i + 1, round(waits[i] * 1e3, 1)) for i in longest]}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    photos = make_photos(args.data_root / f"photos_{args.photos}", args.photos)
    cv = load_example("cv_example")
    import_cv_classifier()
    from cv_classifier.images import find_images
    from cv_classifier.trainer import Trainer, make_accelerator

    cv_args = cv.parse_args(example_args(args, photos, args.image_size, args.epochs)
                            + ["--mixed_precision", args.mixed_precision,
                               "--output_dir", "/tmp/cv_profile_run"])
    samples, skipped = find_images(cv_args.data_dir)
    trainer = Trainer(cv_args, make_accelerator(cv_args), samples, skipped)
    if args.stages:
        stage_timings(trainer, args.epochs)
        return 0
    if args.waits:
        wait_positions(trainer, args.epochs)
        return 0
    plain = trainer.training_batches
    for epoch in range(args.epochs):
        window = ProfiledWindow(args, epoch)
        trainer.training_batches = lambda loader, window=window: window.wrap(plain(loader))
        trainer.train_one_epoch(epoch)
        trainer.position.step_in_epoch = 0  # as Trainer.run does between epochs
        print(f"epoch {epoch + 1}: {trainer.epoch_rates[-1]:,.0f} images/s (profiled window "
              f"included), waited {trainer.data_waits[-1]:.2f} s for data", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
