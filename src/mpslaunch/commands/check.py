"""`mpslaunch check`: read a training script (never run it) and say what will break it on the
plan `launch` would make here, or on the plan the options describe."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from mpslaunch.output import MpslaunchError
from mpslaunch.settings import DEVICES, add_option, add_table_options, folder_main

if TYPE_CHECKING:  # the check itself (ast and the rules) is imported only when a check runs
    from mpslaunch.check import Target

HELP = """\
Read a training script (or a notebook's code cells), and the modules it imports from its own
folder, and say what will break it or slow it on this plan before it runs: a device chosen as
"cuda" if available else "cpu" (on a Mac the script then trains on the CPU), a --device option
that defaults to cuda, cuda written into the script on a Mac or on cpu,
torch.load without map_location, float64 on mps, DataLoader workers that a Mac starts by
spawn (the main guard, lambdas as collate_fn or transforms), nccl for CPU processes,
torch.cuda.amp on mps or cpu, pin_memory on mps. The script is parsed, never imported or
run. The plan is the one `mpslaunch launch` would use here, unless --device or
--num_processes describe another (check a script for a Mac from Linux). Exit code 0: nothing
found; 1: something found; 2: the script cannot be read.

examples:
  mpslaunch check train.py
  mpslaunch check --device mps train.py          as it would run on a Mac
  mpslaunch check --device cpu --num_processes 2 train.py
  mpslaunch check --json train.py                for tools
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_option(
        parser,
        "--device",
        choices=DEVICES,
        help="check for this device (default: the plan launch would use here)",
    )
    add_option(
        parser,
        "--num_processes",
        type=int,
        metavar="N",
        help="processes on this machine, as `launch --num_processes` counts them (default: "
        "the plan's; with --device, one machine is described)",
    )
    add_option(parser, "--json", action="store_true", help="print the findings as JSON")
    add_table_options(parser, "profile", "config_file")
    parser.add_argument(
        "script", help="the training script (a .py file, or a folder with a __main__.py)"
    )


def main(args: argparse.Namespace) -> int:
    if args.num_processes is not None and args.num_processes < 1:
        raise MpslaunchError(f"--num_processes must be 1 or more, not {args.num_processes}")
    from mpslaunch.check import Interrupted, as_json, as_text, check_script

    target = target_from_args(args)
    try:  # a folder: the __main__.py python runs for it
        report = check_script(Path(folder_main(args.script) or args.script), target)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while checking {args.script}") from None
    print(as_json(report) if args.json else as_text(report))
    return 1 if report.findings else 0


def target_from_args(args: argparse.Namespace) -> Target:
    if args.device not in (None, "auto"):
        return _described(args.device, args.num_processes or 1, f"--device {args.device}")
    from mpslaunch import launcher
    from mpslaunch.check import Target
    from mpslaunch.settings import LaunchRequest, profile_files

    loaded = profile_files.read_active(args.config_file, args.profile)
    elsewhere = _for_another_machine(loaded.profile)
    if elsewhere:  # a profile for a Mac, read on Linux: the check needs no such machine
        processes = (
            args.num_processes or loaded.profile.num_processes or 1
        ) * loaded.profile.num_machines
        return _described(elsewhere, processes, f"the profile {loaded.path} asks for mps")
    request = LaunchRequest(args.script, num_processes=args.num_processes)
    plan = launcher.prepare(request, target_is_file=False, loaded=loaded)
    return Target(plan.device, plan.world_size, os.uname().sysname)


def _described(device: str, processes: int, asked: str) -> Target:
    from mpslaunch.check import described_target

    if device == "mps" and processes > 1:
        raise MpslaunchError(
            f"{asked} with {processes} processes, but mps runs one process (a Mac "
            "has one GPU, and the distributed backends take no mps tensors); "
            "check --device cpu for several"
        )
    return described_target(device, processes, os.uname().sysname)


def _for_another_machine(profile) -> str | None:
    """The device a profile names (mps, cuda) when this machine has none of that kind."""
    from mpslaunch.machine import probe
    from mpslaunch.plan import cuda_problem, mps_problem

    problem = {"mps": mps_problem, "cuda": cuda_problem}.get(profile.device)
    return profile.device if problem and problem(probe()) else None
