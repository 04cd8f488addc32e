"""Where cv_example's start-up goes, and how long each epoch waits for its first batch.

Runs examples/cv_example.py unchanged, with its set-up functions wrapped in clocks, under the
launcher (any cv_example option works):

    T0=$(date +%s.%N) PYTHONPATH=src python3 -m mpslaunch launch benchmarks/startup_breakdown.py \\
        --data_dir PHOTOS --model resnet50 --mixed_precision bf16

prints, from T0 (the launch command), the end of the imports, then each set-up stage with the
seconds it took: finding the images (before the model), the model, Accelerator(), the data
loaders, prepare(), the first batch reaching the loop, and the first backward on the device. Last,
for every epoch, the wait from the start of its loop to its first batch.
"""

from __future__ import annotations

import os
import sys
import time

PROBE_STARTED_AT = time.time()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import cv_example as example  # noqa: E402

IMPORTS_DONE_AT = time.time()  # the example's imports: torch, torchvision, Accelerate

marks: list[tuple[str, float]] = []
epochs: list[dict] = []  # per epoch: when its loop started, when its first batch arrived


def mark(name: str) -> None:
    marks.append((name, time.time()))


def clocked(function, name: str):
    def wrapper(*args, **kwargs):
        mark(f"{name} start")
        result = function(*args, **kwargs)
        mark(f"{name} done")
        return result
    return wrapper


def clocked_accelerator(*args, **kwargs):
    accelerator = clocked(real_accelerator, "Accelerator()")(*args, **kwargs)
    accelerator.prepare = clocked(accelerator.prepare, "prepare()")
    real_backward = accelerator.backward

    def backward(loss, **options):  # the first one waits for the device
        global first_step_pending
        real_backward(loss, **options)
        if first_step_pending:
            loss.item()
            mark("first backward done")
            first_step_pending = False

    accelerator.backward = backward
    return accelerator


def epoch_bar(*args, **kwargs):  # the example builds its bar just before each epoch's loop
    epochs.append({"loop": time.perf_counter(), "first_batch": None})
    return real_tqdm(*args, **kwargs)


def clocked_normalize(images):  # the example normalizes each batch as it arrives
    if epochs[-1]["first_batch"] is None:
        epochs[-1]["first_batch"] = time.perf_counter()
    if first_step_pending and not any(name == "first batch arrived" for name, _ in marks):
        mark("first batch arrived")
    return real_normalize(images)


def report(launched_at: float) -> None:
    print(f"startup: launch -> script start {PROBE_STARTED_AT - launched_at:.2f} s; "
          f"cv_example's imports {IMPORTS_DONE_AT - PROBE_STARTED_AT:.2f} s")
    previous = IMPORTS_DONE_AT
    for name, at in marks:
        print(f"startup: {name:24s} at {at - launched_at:6.2f} s  (+{at - previous:.2f} s)")
        previous = at
    waits = ", ".join(f"{epoch['first_batch'] - epoch['loop']:.3f} s" for epoch in epochs)
    print(f"startup: wait for each epoch's first batch: {waits}")


real_normalize, real_tqdm, real_accelerator = example.normalize, example.tqdm, example.Accelerator
first_step_pending = True
example.Accelerator = clocked_accelerator
example.torchvision.models.get_model = clocked(example.torchvision.models.get_model, "the model")
example.make_loader = clocked(example.make_loader, "make_loader")
example.normalize, example.tqdm = clocked_normalize, epoch_bar

if __name__ == "__main__":
    code = example.main()
    if os.environ.get("RANK", "0") == "0":
        report(float(os.environ.get("T0", PROBE_STARTED_AT)))
    sys.exit(code)
