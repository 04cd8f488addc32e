"""A check to run on a machine with two GPUs (CI has none; tests/test_cv_example.py runs the same
on two CPU processes): SIGTERM to rank 1 alone of

    mpslaunch launch --num_processes 2 examples/cv_example.py (benchmark photos, 3 epochs)

once step 10's checkpoint exists. Both ranks must stop at one step (they agree over a gloo
group beside NCCL), with one checkpoint holding both ranks' random states, and exit code 143;
then `--resume_from_checkpoint latest` must finish the run. Prints what happened; judge by eye.

    PYTHONPATH=src python3 benchmarks/cv_stop_check.py
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from cv_throughput import make_photos


def rank_process(rank):
    """The pid of `rank`'s training process (not a DataLoader worker: its parent has no RANK)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            penv = Path(f"/proc/{parent}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and f"RANK={rank}".encode() not in penv:
            return int(pid)


def main() -> None:
    photos = make_photos(Path("/tmp/cv_throughput_data/photos_4000"), 4000)
    out = Path("/tmp/ddp_stop")
    shutil.rmtree(out, ignore_errors=True)  # an old step-10 checkpoint would signal at once
    example = Path(__file__).resolve().parents[1] / "examples" / "cv_example.py"
    cmd = [sys.executable, "-m", "mpslaunch", "launch", "--num_processes", "2", str(example),
           "--data_dir", str(photos), "--output_dir", str(out), "--num_epochs", "3",
           "--checkpointing_steps", "10"]

    started = time.monotonic()
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (out / "checkpoints" / "step_00000010").exists():
        assert process.poll() is None, process.communicate()
        time.sleep(0.02)
    pid = rank_process(1)
    print(f"step 10 checkpoint after {time.monotonic() - started:.1f}s; SIGTERM to rank 1 "
          f"(pid {pid})", flush=True)
    os.kill(pid, signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    print("exit code", process.returncode, "(143 expected)")
    print("stdout tail:", stdout[-600:])
    print("stderr tail:", stderr[-1500:])
    for checkpoint in sorted((out / "checkpoints").iterdir()):
        print(checkpoint.name, sorted(p.name for p in checkpoint.iterdir()))
    print("metrics.json exists:", (out / "metrics.json").exists(), flush=True)
    resumed = subprocess.run(cmd + ["--resume_from_checkpoint", "latest"], capture_output=True,
                             text=True, timeout=200)
    print("resume exit code", resumed.returncode)
    print("resume stdout tail:", resumed.stdout[-800:])
    print("resume stderr tail:", resumed.stderr[-800:])
    if (out / "metrics.json").exists():
        print(json.dumps(json.loads((out / "metrics.json").read_text()), indent=1))


if __name__ == "__main__":
    main()
