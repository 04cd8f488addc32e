"""How long the check takes on a 1,500-line training script, what it adds to Python's own
start and to `mpslaunch launch` (`launch --cpu s.py` against `launch --cpu --no_check s.py` and
`python s.py`), and how time and memory grow on a huge file.

The script is generated: 2,000 lines of ordinary training code (models, datasets, loaders,
training and evaluation loops, checkpoints), every function reachable from main(); its main()
runs only when TRAIN is set, so under launch it imports torch and exits, like the start of
any training script. Timed in-process (median of many runs after a warm-up), beside a bare
`ast.parse` of the script: `mpslaunch check` (the whole file parsed), launch's first check of
the script (only the functions a rule can be about parsed), and launch's check of a script
seen before (the kept findings read back). The launch commands alternate, medians compared;
"cold" gives every launch an empty cache folder. The "stub torch" rows run the same script
with a do-nothing torch package beside it, so the child starts in milliseconds and the
launcher's own cost, and the check's share of it, show. "Python's own start" is `python -c
pass` against a Python that imports the check and runs launch's first check of the script,
in turn. The huge file is many small functions (the shape that made the check grow as
functions times file size), checked whole in a child of its own beside a bare `ast.parse`:
seconds and peak memory (maxrss).

`--also_src DIR` times another checkout's check (its `src` folder) beside this one in the same
run: the in-process times in children that take turns (`--rounds`; this checkout's too, the
same way), then in one process, the other checkout's package loaded under another name and the
two checks taking turns call by call, Python's start with each, and the huge file with each. "Seen before" includes
working out the rules' digest, which each launch does once. `--clock cpu` times the in-process
checks by the process's own CPU time, which other work on a shared machine disturbs less.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER = '''"""A generated training script: many models, loaders and loops."""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--resume", default="")
    return parser.parse_args()

'''

BLOCK = '''
class Data{i}(Dataset):
    """Random features and labels for part {i}."""

    def __init__(self, size, width, transform=None):
        self.features = torch.randn(size, width)
        self.labels = torch.randint(0, 10, (size,))
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        x = self.features[index]
        if self.transform is not None:
            x = self.transform(x)
        return x, self.labels[index]


def normalize_{i}(x):
    return (x - x.mean()) / (x.std() + 1e-6)


def collate_{i}(batch):
    features = torch.stack([item[0] for item in batch])
    labels = torch.stack([item[1] for item in batch])
    return features, labels


class Model{i}(nn.Module):
    def __init__(self, width, hidden=64, classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.head = nn.Linear(hidden, classes)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        h = self.body(x)
        h = self.dropout(F.gelu(h))
        return self.head(h)


def make_loader_{i}(args, train=True):
    data = Data{i}(256, 16, transform=normalize_{i})
    return DataLoader(data, batch_size=32, shuffle=train, num_workers=args.workers,
                      collate_fn=collate_{i}, drop_last=train)


def train_{i}(args, device):
    model = Model{i}(16).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    if args.resume:
        model.load_state_dict(torch.load(args.resume, map_location=device))
    for epoch in range(args.epochs):
        model.train()
        total, count = 0.0, 0
        for features, labels in make_loader_{i}(args):
            features, labels = features.to(device), labels.to(device)
            with torch.autocast(device.type, enabled=device.type == "cuda"):
                loss = F.cross_entropy(model(features), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            total += loss.item() * len(labels)
            count += len(labels)
        scheduler.step()
        accuracy = evaluate_{i}(args, model, device)
        print(f"part {i} epoch {{epoch}}: loss {{total / count:.3f}}, accuracy {{accuracy:.3f}}")
    torch.save(model.state_dict(), os.path.join("checkpoints", "part{i}.pt"))
    return model


@torch.no_grad()
def evaluate_{i}(args, model, device):
    model.eval()
    right, seen = 0, 0
    for features, labels in make_loader_{i}(args, train=False):
        predictions = model(features.to(device)).argmax(dim=1)
        right += (predictions.cpu() == labels).sum().item()
        seen += len(labels)
    return right / max(seen, 1)
'''

FOOTER = '''

def main():
    args = parse_args()
    device = torch.device(os.environ.get("MPSLAUNCH_DEVICE", "cpu"))
    for part in PARTS:
        part(args, device)


PARTS = [{parts}]

if __name__ == "__main__" and os.environ.get("TRAIN"):
    main()
'''


# A do-nothing torch beside the script: enough for its module-level code (classes, decorators).
STUB_TORCH = {
    "torch/__init__.py": "from . import nn, optim, utils\n\n\ndef no_grad():\n    return lambda f: f\n",
    "torch/nn/__init__.py": "from . import functional\n\n\nclass Module:\n    pass\n",
    "torch/nn/functional.py": "",
    "torch/optim/__init__.py": "",
    "torch/utils/__init__.py": "from . import data\n",
    "torch/utils/data.py": "class Dataset:\n    pass\n\n\nclass DataLoader:\n    pass\n",
}


def generated_script(lines: int = 2000) -> str:
    blocks, index = [], 0
    while True:
        text = HEADER + "".join(blocks) + FOOTER.format(parts=", ".join(f"train_{n}" for n in range(index)))
        if text.count("\n") >= lines:
            return text
        blocks.append(BLOCK.format(i=index))
        index += 1


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: this process's own time
CLOCK = [time.perf_counter]


def median_ms(action, runs: int) -> tuple[float, float]:
    clock = CLOCK[0]
    action()  # warm-up
    samples = []
    for _ in range(runs):
        start = clock()
        action()
        samples.append(clock() - start)
    return 1000 * statistics.median(samples), 1000 * min(samples)


def time_checks(script: Path, runs: int) -> dict[str, tuple[float, float]]:
    import ast

    from mpslaunch.check import Target, cache, check_script, check_sources
    from mpslaunch.check.reading import read_sources

    target = Target("mps", 1, "Darwin")
    text = script.read_text()
    folder = Path(tempfile.mkdtemp(prefix="mpslaunch-check-cache-"))
    sources = read_sources(script, whole=False)
    report = check_sources(sources, target)
    if hasattr(sources, "read"):  # this checkout's cache.save
        cache.save(script, target, sources.read, sources.absent, report, folder, sources.listed)
    else:  # an older checkout's
        cache.save(script, target, sources, report, folder)
    try:
        from mpslaunch.check import registry
        digests = registry._digest  # worked out once per launch: time it each time
    except ImportError:
        digests = []

    def seen_before():
        digests.clear()
        return cache.read(script, target, folder)

    assert seen_before() is not None
    times = {
        "ast.parse alone": median_ms(lambda: ast.parse(text), runs),
        "mpslaunch check (whole file)": median_ms(lambda: check_script(script, target), runs),
        "launch, first check": median_ms(lambda: check_script(script, target, whole=False), runs),
        "launch, script seen before": median_ms(seen_before, runs),
    }
    shutil.rmtree(folder, ignore_errors=True)
    return times


def renamed_copy(src: Path, folder: Path, name: str = "mpslaunch_other") -> str:
    """A copy of the mpslaunch package under src, importable as `name` beside this checkout's
    (its own imports of mpslaunch rewritten), so both checks run in one process."""
    target = folder / name
    shutil.copytree(src / "mpslaunch", target, ignore=shutil.ignore_patterns("__pycache__"))
    for path in target.rglob("*.py"):
        text = path.read_text()
        path.write_text(re.sub(r"(?m)^([ \t]*)(from|import) mpslaunch\b", rf"\1\2 {name}", text))
    sys.path.insert(0, str(folder))
    return name


def paired_checks(script: Path, other_src: Path, runs: int) -> dict[str, dict[str, tuple[float, float]]]:
    """Both checks in this process, taking turns call by call (the order swapped each time), so
    other work on the machine weighs on both alike: median and best ms of each, per measure."""
    import ast
    import importlib

    folder = Path(tempfile.mkdtemp(prefix="mpslaunch-other-"))
    packages = {"this checkout": "mpslaunch", str(other_src): renamed_copy(other_src, folder)}
    clock, text, actions = CLOCK[0], script.read_text(), {}
    for label, package in packages.items():
        check = importlib.import_module(f"{package}.check")
        cache = importlib.import_module(f"{package}.check.cache")
        reading = importlib.import_module(f"{package}.check.reading")
        target = check.Target("mps", 1, "Darwin")
        kept = folder / f"kept-{package}"
        sources = reading.read_sources(script, whole=False)
        report = check.check_sources(sources, target)
        if hasattr(sources, "read"):
            cache.save(script, target, sources.read, sources.absent, report, kept, sources.listed)
        else:
            cache.save(script, target, sources, report, kept)
        try:
            digests = importlib.import_module(f"{package}.check.registry")._digest
        except ImportError:
            digests = []

        def seen_before(cache=cache, target=target, kept=kept, digests=digests):
            digests.clear()  # worked out once per launch
            assert cache.read(script, target, kept) is not None

        actions[label] = {
            "ast.parse alone": lambda: ast.parse(text),
            "mpslaunch check (whole file)": lambda check=check, target=target: check.check_script(script, target),
            "launch, first check": lambda check=check, target=target: check.check_script(script, target, whole=False),
            "launch, script seen before": seen_before,
        }
    samples = {label: {name: [] for name in measures} for label, measures in actions.items()}
    labels = list(actions)
    for name in actions[labels[0]]:
        for label in labels:
            actions[label][name]()  # warm-up
        for turn in range(runs):
            for label in (labels if turn % 2 == 0 else labels[::-1]):
                start = clock()
                actions[label][name]()
                samples[label][name].append(clock() - start)
    shutil.rmtree(folder, ignore_errors=True)
    return {label: {name: (1000 * statistics.median(values), 1000 * min(values)) for name, values in measures.items()}
            for label, measures in samples.items()}


def time_checks_of(trees: dict[str, Path], script: Path, runs: int, rounds: int, clock: str) -> dict:
    """time_checks of each tree's check in children that take turns: the median of each
    round's medians, and the best."""
    found: dict[str, dict[str, list]] = {label: {} for label in trees}
    for _ in range(rounds):
        for label, src in trees.items():
            done = subprocess.run([sys.executable, __file__, "--time_checks", str(script), "--check_runs",
                                   str(runs), "--clock", clock], capture_output=True, text=True, check=True,
                                  env={**os.environ, "PYTHONPATH": str(src)})
            for name, (median, best) in json.loads(done.stdout).items():
                found[label].setdefault(name, []).append((median, best))
    return {label: {name: (statistics.median(m for m, _ in values), min(b for _, b in values))
                    for name, values in times.items()} for label, times in found.items()}


CHECK_IN_A_CHILD = """
import ast, json, resource, sys, time
from pathlib import Path
start = time.perf_counter()
if sys.argv[2] == "parse":
    ast.parse(Path(sys.argv[1]).read_text())
else:
    from mpslaunch.check import Target, check_script
    check_script(Path(sys.argv[1]), Target("mps", 1, "Darwin"), whole=sys.argv[2] == "check")
print(json.dumps([time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))
"""


def huge_script(megabytes: float) -> str:
    """Many small functions, each called once and putting a tensor on cuda."""
    parts, size, index = ["import torch\n\n"], 0, 0
    while size < megabytes * 1e6:
        part = f"def step_{index}(x):\n    y = x * {index} + 1\n    return y.cuda()\n\n\nstep_{index}(torch.ones(1))\n\n"
        parts.append(part)
        size += len(part)
        index += 1
    return "".join(parts)


def time_huge(script: Path, src: Path | None = None) -> dict[str, tuple[float, float]]:
    """(seconds, peak MB) of a bare parse and of the whole check, each in a child of its own."""
    found = {}
    env = {**os.environ, **({"PYTHONPATH": str(src)} if src else {})}
    for label, mode in (("ast.parse alone", "parse"), ("mpslaunch check (whole file)", "check")):
        done = subprocess.run([sys.executable, "-c", CHECK_IN_A_CHILD, str(script), mode],
                              capture_output=True, text=True, check=True, env=env)
        seconds, maxrss = json.loads(done.stdout)
        found[label] = (seconds, maxrss / 1024)  # Linux gives KiB
    return found


def time_start(script: Path, runs: int, trees: dict[str, Path]) -> dict[str, float]:
    """Medians (ms) of Python's own start and of a start that runs launch's first check (with
    each tree's check)."""
    code = ("import sys; from pathlib import Path; from mpslaunch.check import Target, check_script; "
            "check_script(Path(sys.argv[1]), Target('mps', 1, 'Darwin'), whole=False)")
    commands = {"python -c pass": ([sys.executable, "-c", "pass"], None)}
    for label, src in trees.items():
        commands[f"python + launch's first check{label}"] = ([sys.executable, "-c", code, str(script)], src)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs + 1):
        for name, (command, src) in commands.items():
            env = {**os.environ, **({"PYTHONPATH": str(src)} if src else {})}
            start = time.perf_counter()
            subprocess.run(command, check=True, env=env)
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(values[1:]) for name, values in times.items()}


def mpslaunch_command() -> list[str]:
    found = shutil.which("mpslaunch", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "mpslaunch"]


def time_once(command: list[str], cache_folder) -> float:
    env = dict(os.environ)
    if cache_folder == "fresh":
        env["MPSLAUNCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="mpslaunch-check-cold-")
    elif cache_folder is not None:
        env["MPSLAUNCH_CACHE_DIR"] = str(cache_folder)
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    elapsed = time.perf_counter() - start
    if cache_folder == "fresh":
        shutil.rmtree(env["MPSLAUNCH_CACHE_DIR"], ignore_errors=True)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check_runs", type=int, default=30, help="timed checks of each kind (default 30)")
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (default 7)")
    parser.add_argument("--lines", type=int, default=1500, help="lines of the script (default 1500)")
    parser.add_argument("--huge_mb", type=float, default=1.9, help="size of the huge file (default 1.9 MB)")
    parser.add_argument("--also_src", type=Path, help="another checkout's src folder, timed beside this one")
    parser.add_argument("--rounds", type=int, default=3, help="turns of each checkout's children (default 3)")
    parser.add_argument("--clock", choices=CLOCKS, default="wall",
                        help="what the in-process checks are timed by: wall time, or the process's own "
                             "CPU time (steadier on a machine other work shares)")
    parser.add_argument("--checks_only", action="store_true",
                        help="time only the checks in-process (not Python's start, the huge file, launches)")
    parser.add_argument("--time_checks", type=Path, help=argparse.SUPPRESS)  # a child's work
    options = parser.parse_args()
    CLOCK[0] = CLOCKS[options.clock]
    if options.time_checks:
        print(json.dumps(time_checks(options.time_checks, options.check_runs)))
        return 0
    here = Path(__file__).resolve().parents[1] / "src"
    trees = {"": here, **({f" [{options.also_src}]": options.also_src.resolve()} if options.also_src else {})}
    folder = Path(tempfile.mkdtemp(prefix="mpslaunch-check-bench-"))
    script = folder / "s.py"
    script.write_text(generated_script(options.lines))
    os.environ.setdefault("MPSLAUNCH_CONFIG_DIR", str(folder))  # no user profile interferes
    lines = script.read_text().count("\n")
    if options.also_src:
        print(f"{lines}-line script, {options.check_runs} runs each in {options.rounds} alternating children "
              f"per checkout, {options.clock} time: median of the medians, ms (best)")
        for label, times in time_checks_of(trees, script, options.check_runs, options.rounds, options.clock).items():
            print(f"  {label.strip() or 'this checkout'}")
            for name, (median, best) in times.items():
                print(f"    {name:30} {median:7.1f} ({best:.1f})")
        paired = paired_checks(script, options.also_src.resolve(), options.check_runs * options.rounds)
        print(f"the same in one process, the two checks taking turns, {options.check_runs * options.rounds} "
              f"runs each, {options.clock} time: median ms (best), and this checkout's over the other's")
        mine, theirs = paired.values()
        for name in mine:
            ratio = mine[name][0] / theirs[name][0] if theirs[name][0] else float("nan")
            print(f"  {name:30} {mine[name][0]:7.1f} ({mine[name][1]:.1f})  {theirs[name][0]:7.1f} "
                  f"({theirs[name][1]:.1f})  {ratio:5.2f}")
    else:
        print(f"{lines}-line script, {options.check_runs} runs each, {options.clock} time: median ms (best)")
        for name, (median, best) in time_checks(script, options.check_runs).items():
            print(f"  {name:32} {median:7.1f} ({best:.1f})")
    if options.checks_only:
        shutil.rmtree(folder, ignore_errors=True)
        return 0
    start = time_start(script, options.runs * 3, trees)
    print(f"Python's own start and the check, {options.runs * 3} alternating runs: median ms")
    for name, value in start.items():
        print(f"  {name:32} {value:7.1f}")
    for label in trees:
        added = start[f"python + launch's first check{label}"] - start["python -c pass"]
        print(f"  {'the check adds' + label:32} {added:7.1f}")
    huge = folder / "huge.py"
    huge.write_text(huge_script(options.huge_mb))
    print(f"a huge file, {huge.stat().st_size / 1e6:.1f} MB: seconds, peak MB")
    for label, src in trees.items():
        for name, (seconds, megabytes) in time_huge(huge, src).items():
            print(f"  {name + label:32} {seconds:7.2f} {megabytes:7.0f}")
    stubbed = folder / "stub" / "s.py"
    for name, text in {"s.py": script.read_text(), **STUB_TORCH}.items():
        (stubbed.parent / name).parent.mkdir(parents=True, exist_ok=True)
        (stubbed.parent / name).write_text(text)
    launch = [*mpslaunch_command(), "launch", "--cpu"]
    commands = {}
    for label, path in (("", script), (", stub torch", stubbed)):
        commands.update({
            f"python s.py{label}": ([sys.executable, str(path)], None),
            f"launch --no_check{label}": ([*launch, "--no_check", str(path)], None),
            f"launch, seen before{label}": ([*launch, str(path)], folder / "cache"),
            f"launch, cold{label}": ([*launch, str(path)], "fresh"),
        })
    for command, cache_folder in commands.values():
        time_once(command, cache_folder)  # warm the file cache (and the check's cache)
    times = {name: [] for name in commands}
    for _ in range(options.runs):
        for name, (command, cache_folder) in commands.items():
            times[name].append(time_once(command, cache_folder))
    print(f"{'command':32} {'median s':>9} {'vs python':>10} {'vs --no_check':>14}   "
          f"({options.runs} alternating runs)")
    for label in ("", ", stub torch"):
        base = statistics.median(times[f"python s.py{label}"])
        unchecked = statistics.median(times[f"launch --no_check{label}"])
        for name in (f"python s.py{label}", f"launch --no_check{label}", f"launch, seen before{label}",
                     f"launch, cold{label}"):
            value = statistics.median(times[name])
            print(f"{name:32} {value:9.3f} {value / base:10.3f} {value / unchecked:14.3f}")
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
