"""How often a correct 2-rank gloo script aborts at interpreter exit, through mpslaunch and
through plain torchrun, side by side.

    python benchmarks/gloo_exit_aborts.py [--runs 100] [--one-core]

The script (DistributedDataParallel, DistributedSampler, 5 steps, an all_reduce, then
destroy_process_group) prints its result on every rank, then exits. On Python 3.13 and older a
gloo worker thread that drops the last reference to a tensor while the interpreter finalizes
takes the GIL there, is unwound by pthread_exit through a noexcept frame, and std::terminate
aborts the rank: "terminate called without an active exception", SIGABRT, after correct results
(pytorch/pytorch#190489, #117762). The window is tiny, so the rate depends on how busy the
machine is; --one-core pins both ranks to one core, which widens it without loading the other
cores. The two launchers run in alternation so that both see the same machine. For each, the
counts: runs, runs that ended with an abort at exit, runs whose results were correct anyway,
other failures; and, for mpslaunch, whether its summary named the abort as torch's exit.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SCRIPT = """
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (inputs, targets) in enumerate(loader):
    if step == 5:
        break
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(inputs), targets).backward()
    optimizer.step()
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(f"RESULT {dist.get_rank()} {total.item()}", flush=True)  # one write: ranks share a pipe
dist.destroy_process_group()
"""
ABORT_LINE = "terminate called without an active exception"


@dataclass
class Tally:
    runs: int = 0
    aborted_at_exit: int = 0
    correct_results: int = 0
    other_failures: int = 0
    named_by_summary: int = 0

    def add(self, code: int, output: str) -> None:
        self.runs += 1
        results = set(re.findall(r"RESULT (\d) 3\.0", output))
        self.correct_results += results == {"0", "1"}
        if ABORT_LINE in output and code in (134, 1):  # torchrun ends 1 when a rank aborted
            self.aborted_at_exit += 1
            self.named_by_summary += "aborted in torch's exit" in output
        elif code != 0:
            self.other_failures += 1

    def line(self, name: str) -> str:
        rate = self.aborted_at_exit / self.runs if self.runs else 0.0
        return (f"{name:10} runs {self.runs:4}  aborted at exit {self.aborted_at_exit:4} "
                f"({rate:6.1%})  correct results {self.correct_results:4}  other failures "
                f"{self.other_failures:3}  named by the summary {self.named_by_summary:4}")


def commands(script: Path, port: int) -> dict[str, list[str]]:
    mpslaunch = shutil.which("mpslaunch", path=str(Path(sys.executable).parent))
    launcher = [mpslaunch] if mpslaunch else [sys.executable, "-m", "mpslaunch"]
    return {
        "mpslaunch": [*launcher, "launch", "--cpu", "-q", "--num_processes", "2", str(script)],
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                     "--master-addr", "127.0.0.1", "--master-port", str(port), str(script)],
    }


def run_once(command: list[str], one_core: bool) -> tuple[int, str]:
    prefix = ["taskset", "-c", "0"] if one_core else []
    done = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="runs of each launcher")
    parser.add_argument("--one-core", action="store_true",
                        help="pin both ranks to one core (Linux taskset)")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mpslaunch-aborts-"))
    script = folder / "ddp_then_exit.py"
    script.write_text(SCRIPT)
    os.environ.setdefault("MPSLAUNCH_CONFIG_DIR", str(folder))  # no user profile interferes
    tallies = {"mpslaunch": Tally(), "torchrun": Tally()}
    for number in range(options.runs):
        for name, command in commands(script, 29600 + number % 200).items():
            code, output = run_once(command, options.one_core)
            tallies[name].add(code, output)
        if (number + 1) % 10 == 0:
            print(f"after {number + 1} runs each:", file=sys.stderr, flush=True)
            for name, tally in tallies.items():
                print("  " + tally.line(name), file=sys.stderr, flush=True)
    print(f"{options.runs} runs each, alternating; python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cores{', ranks pinned to one core' if options.one_core else ''}")
    for name, tally in tallies.items():
        print(tally.line(name))
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
