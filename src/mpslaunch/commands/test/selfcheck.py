"""The check script `mpslaunch test` launches in every rank: an ordinary script that knows the
plan only from its arguments and checks what this process actually got. Standard library, torch
and (optionally) accelerate only, and number_check.py beside it (a script's own folder is on its
path). Each rank writes REPORT_DIR/rank-<RANK>.json and exits 0 (a nonzero exit would make
torchrun stop the others before they report); a watchdog ends a hung rank.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import warnings
from datetime import timedelta

import number_check

WHAT_TO_REPORT = "run `mpslaunch env` and report it with this output"


class Checks:
    """Collects check results and writes the rank's report (also from the watchdog)."""

    def __init__(self, report_dir: str, rank: int, world_size: int):
        self.path = os.path.join(report_dir, f"rank-{rank}.json")
        self.rank, self.world_size = rank, world_size
        self.results: list[dict] = []
        self.running = "start-up"
        self.lock = threading.Lock()

    def record(
        self, name: str, ok: bool, detail: str, fix: str = "", figures: dict | None = None
    ) -> None:
        with self.lock:
            self.results.append(
                {
                    "name": name,
                    "ok": ok,
                    "detail": detail,
                    "fix": fix,
                    **({"figures": figures} if figures else {}),
                }
            )

    def write(self) -> None:
        with self.lock:
            document = {
                "rank": self.rank,
                "world_size": self.world_size,
                "checks": list(self.results),
            }
        # Atomic: the launcher never reads half a report.
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(self.path), suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(document, stream)
        os.replace(temporary, self.path)


def start_watchdog(checks: Checks, seconds: float) -> None:
    def give_up() -> None:
        checks.record(
            checks.running,
            False,
            f"did not finish within {seconds:.0f} s",
            "a rank hung; with several processes, check that every rank can reach "
            "the others (firewall, --main_process_port), or raise --timeout",
        )
        checks.write()
        os._exit(1)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()


def run_check(checks: Checks, name: str, function, *args) -> object:
    """Run one check; an unexpected exception is a failure of that check, not a crash."""
    checks.running = name
    try:
        return function(checks, name, *args)
    except Exception as error:  # noqa: BLE001 - every failure must reach the report
        checks.record(name, False, f"{type(error).__name__}: {first_line(error)}", WHAT_TO_REPORT)
        return None


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else ""


# ---- device ----------------------------------------------------------------------------------


def rank_device(torch, planned: str):
    """The device this rank should compute on: with several cuda ranks, its own GPU."""
    if planned == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(planned)


def check_device(checks: Checks, name: str, torch, planned: str):
    problems, fixes = [], []
    seen = os.environ.get("MPSLAUNCH_DEVICE")
    if seen != planned:
        problems.append(f"MPSLAUNCH_DEVICE is {seen!r}, the plan says {planned!r}")
        fixes.append("the launcher's environment did not reach the script; " + WHAT_TO_REPORT)
    device = rank_device(torch, planned)
    try:
        landed = (torch.ones(4, device=device) * 2).sum().item() == 8.0
    except Exception as error:  # noqa: BLE001
        problems.append(f"torch cannot compute on {device} ({first_line(error)})")
        fixes.append(_unusable_device_fix(planned))
    else:
        if not landed:
            problems.append(f"a sum on {device} gave a wrong answer")
            fixes.append(WHAT_TO_REPORT)
    accelerator, via = _accelerator(torch, problems, fixes, planned)
    if problems:
        checks.record(name, False, "; ".join(problems), "; ".join(dict.fromkeys(fixes)))
    else:
        checks.record(name, True, f"{device} ({via})")
    return accelerator


def _accelerator(torch, problems: list[str], fixes: list[str], planned: str):
    """An unmodified Accelerator(), as a user's script makes it, and whether it followed the plan."""
    try:
        from accelerate import Accelerator
    except ImportError:
        return None, "MPSLAUNCH_DEVICE and a real tensor; accelerate not installed"
    accelerator = Accelerator()
    got = accelerator.device
    own_gpu = planned != "cuda" or got.index in (None, int(os.environ.get("LOCAL_RANK", "0")))
    if got.type != planned or not own_gpu:
        problems.append(
            f"Accelerator() put this process on {got}, the plan says {rank_device(torch, planned)}"
        )
        fixes.append(_accelerate_override_fix())
    return accelerator, "MPSLAUNCH_DEVICE, a real tensor and Accelerator() agree"


def _accelerate_override_fix() -> str:
    # The launcher always sets these two; any other ACCELERATE_* variable is the user's own.
    ours = {"ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION"}
    theirs = sorted(
        f"{k}={v}" for k, v in os.environ.items() if k.startswith("ACCELERATE_") and k not in ours
    )
    if theirs:
        return f"unset {', '.join(theirs)}: set in your environment, it overrides the plan"
    return WHAT_TO_REPORT


def _unusable_device_fix(planned: str) -> str:
    if planned == "mps":
        return (
            "torch in the script's Python cannot use the Mac's GPU (sandboxes and some CI "
            'Macs have no Metal device); check `python -c "import torch; '
            'print(torch.backends.mps.is_available())"`, or run with --cpu'
        )
    if planned == "cuda":
        return (
            "torch in the script's Python cannot use the GPU; check `nvidia-smi` and "
            "CUDA_VISIBLE_DEVICES, or run with --cpu"
        )
    return WHAT_TO_REPORT


# ---- training --------------------------------------------------------------------------------


def tiny_model(torch):
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def tiny_batch(torch, device):
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(16, 32, generator=generator)
    labels = torch.randint(0, 4, (16,), generator=generator)
    return inputs.to(device), labels.to(device)


def check_train_step(checks: Checks, name: str, torch, planned: str) -> None:
    device = rank_device(torch, planned)
    torch.manual_seed(0)
    model = tiny_model(torch).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, labels = tiny_batch(torch, device)
    before = [p.detach().clone() for p in model.parameters()]
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    moved = any(
        not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters(), strict=True)
    )
    fix = f"training on {planned} does not work; check with --cpu, and " + WHAT_TO_REPORT
    if not all(math.isfinite(x) for x in losses):
        checks.record(name, False, f"the loss is not finite on {device}: {losses}", fix)
    elif not moved:
        checks.record(
            name, False, f"the optimizer step left the weights unchanged on {device}", fix
        )
    else:
        checks.record(
            name,
            True,
            f"forward, backward, SGD step on {device}; loss {losses[0]:.3f} -> {losses[-1]:.3f}",
        )


def check_mixed_precision(
    checks: Checks, name: str, torch, planned: str, precision: str, accelerator
) -> None:
    problems = []
    if accelerator is not None and accelerator.mixed_precision != precision:
        problems.append(
            f"Accelerator() chose mixed precision {accelerator.mixed_precision!r}, "
            f"the plan says {precision!r}"
        )
    if precision == "no":
        detail = "off: float32 throughout"
    else:
        detail, problem = _autocast_step(torch, rank_device(torch, planned), precision)
        if problem:
            problems.append(problem)
    if problems:
        checks.record(
            name,
            False,
            "; ".join(problems),
            f"use --mixed_precision no (or another precision) on {planned}, "
            "or unset ACCELERATE_MIXED_PRECISION if you set it yourself",
        )
    else:
        checks.record(name, True, detail)


def _autocast_step(torch, device, precision: str) -> tuple[str, str]:
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    torch.manual_seed(0)
    model = tiny_model(torch).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = number_check.grad_scaler(torch, device.type) if precision == "fp16" else None
    inputs, labels = tiny_batch(torch, device)
    with torch.autocast(device_type=device.type, dtype=dtype):
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits, labels)
    if logits.dtype != dtype:
        return "", f"autocast on {device} computed in {logits.dtype}, not {dtype}"
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    if not math.isfinite(loss.item()):
        return "", f"the {precision} loss is not finite on {device}"
    scaled = " with GradScaler" if scaler is not None else ""
    return f"{precision}: autocast computes in {dtype}, step{scaled} works on {device}", ""


def check_numbers(checks: Checks, name: str, torch, planned: str, precision: str) -> None:
    """The device's numbers against the CPU's float64, through a few training steps."""
    result = number_check.compare(torch, rank_device(torch, planned), precision)
    fix = (
        ""
        if result.ok
        else (
            f"{planned} computes other numbers than the CPU: see the plan line's warnings and "
            'docs/mps-facts.md, "Known faults", in mpslaunch\'s repository; upgrade torch, try '
            "--mixed_precision no, or compare with --cpu; " + WHAT_TO_REPORT
        )
    )
    checks.record(name, result.ok, number_check.describe(result), fix, result.figures())


# ---- mps fallback and all-reduce -------------------------------------------------------------


def check_mps_fallback(checks: Checks, name: str, expected: str) -> None:
    seen = os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK")
    if seen == expected:
        state = (
            "on: ops without an mps kernel run on the cpu" if expected == "1" else "off, as planned"
        )
        checks.record(name, True, f"PYTORCH_ENABLE_MPS_FALLBACK={seen} ({state})")
    else:
        checks.record(
            name,
            False,
            f"PYTORCH_ENABLE_MPS_FALLBACK is {seen!r}, the plan set {expected!r}",
            "torch reads it once at import, so set it before the "
            "script starts: remove it from your shell (mpslaunch sets it) or set "
            "mps_fallback in the profile",
        )


def check_all_reduce(checks: Checks, name: str, torch, planned: str, expected_world: int) -> None:
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != expected_world:
        checks.record(
            name,
            False,
            f"WORLD_SIZE is {world}, the plan says {expected_world}",
            "the processes were not started as planned; " + WHAT_TO_REPORT,
        )
        return
    backend = "nccl" if planned == "cuda" else "gloo"
    if not dist.is_initialized():  # Accelerator() has usually done it already
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=60))
    device = rank_device(torch, planned)
    value = torch.tensor([float(dist.get_rank() + 1)], device=device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    if value.item() == expected:
        checks.record(
            name, True, f"{world} ranks summed to {value.item():g} over {dist.get_backend()}"
        )
    else:
        checks.record(
            name,
            False,
            f"{world} ranks summed to {value.item():g}, expected {expected:g}",
            WHAT_TO_REPORT,
        )


# ---- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="mpslaunch's self-check (run by mpslaunch test)")
    parser.add_argument("--report-dir", required=True)
    parser.add_argument("--expect-device", required=True, choices=("cpu", "mps", "cuda"))
    parser.add_argument("--expect-precision", required=True, choices=("no", "fp16", "bf16"))
    parser.add_argument("--expect-world-size", required=True, type=int)
    parser.add_argument("--expect-mps-fallback", default="1", choices=("0", "1"))
    parser.add_argument("--timeout", type=float, default=300.0)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    checks = Checks(
        args.report_dir, int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    )
    start_watchdog(checks, args.timeout)
    warnings.simplefilter("ignore")  # the report is the output; library chatter is noise here
    import torch

    device = args.expect_device
    accelerator = run_check(checks, "device", check_device, torch, device)
    run_check(checks, "train step", check_train_step, torch, device)
    run_check(checks, "numbers", check_numbers, torch, device, args.expect_precision)
    run_check(
        checks,
        "mixed precision",
        check_mixed_precision,
        torch,
        device,
        args.expect_precision,
        accelerator,
    )
    if device == "mps":
        run_check(checks, "mps fallback", check_mps_fallback, args.expect_mps_fallback)
    if args.expect_world_size > 1:
        run_check(checks, "all-reduce", check_all_reduce, torch, device, args.expect_world_size)
    checks.write()
    _leave_process_group(torch)
    return 0


def _leave_process_group(torch) -> None:
    """Wait until every rank is done with its collectives; the process then ends at once
    (end_now). No destroy_process_group: on torch 2.4, gloo's can wait forever for a rank that
    has already left."""
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()
    except Exception:  # noqa: BLE001 - the report is already written
        pass


def end_now(code: int) -> None:
    """Exit without the interpreter's teardown: the report, the verdict, is written, and in that
    teardown torch's gloo can abort a rank whose checks all passed (pytorch/pytorch#190489)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    end_now(main(sys.argv[1:]))
