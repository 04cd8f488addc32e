"""`mpslaunch launch [options] script.py [script args...]` (or `-m module`).

Parse the flags into a LaunchRequest, load the profile in force, probe the machine, resolve the
plan, then print it (--dry-run) or run it. Everything after the script name belongs to the script,
even arguments that look like launcher options. This module's imports stay light: the
single-process path never imports torch.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import threading
from pathlib import Path

from mpslaunch import machine as machine_probe
from mpslaunch import profile as profiles
from mpslaunch.errors import MpslaunchError
from mpslaunch.commands.options import add_option, add_profile_options
from mpslaunch.plan import LaunchPlan, LaunchRequest, resolve
from mpslaunch.run.single import DEFAULT_GRACE_SECONDS, run_child



def add_arguments(parser: argparse.ArgumentParser) -> None:
    def option(name: str, **kwargs) -> None:
        add_option(parser, name, **kwargs)

    plan = parser.add_argument_group("what to run on")
    option("--cpu", action="store_true", help="run on the CPU whatever the machine has")
    plan.add_argument("--device", choices=profiles.DEVICES, help="auto (default), mps, cuda or cpu")
    option("--mixed_precision", choices=profiles.PRECISIONS, help="no, fp16 or bf16")
    option("--num_processes", type=int, metavar="N", help="processes on this machine (default: one per NVIDIA GPU, else 1)")
    multi = parser.add_argument_group("several machines (through torch.distributed.run)")
    for name, kind, text in (
        ("--num_machines", int, "how many machines take part"),
        ("--machine_rank", int, "this machine's rank, from 0"),
        ("--main_process_ip", str, "address of machine 0"),
        ("--main_process_port", int, "port on machine 0 (0: pick a free one)"),
        ("--max_restarts", int, "restarts of the worker group after a failure"),
    ):
        add_option(multi, name, type=kind, metavar=name.split("_")[-1].upper(), help=text)
    add_option(multi, "--rdzv_backend", choices=profiles.RDZV_BACKENDS,
               help="rendezvous: static (default) or c10d")
    option("--log_dir", metavar="DIR", help="also write each rank's output to DIR")
    add_profile_options(parser)
    option("--grace_period", type=float, default=DEFAULT_GRACE_SECONDS, metavar="SECONDS",
           help="after Ctrl-C or SIGTERM, how long the script may take to stop (default 30)")
    option("--dry_run", action="store_true", help="print the plan and run nothing")
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary line before the run")
    parser.add_argument("-m", "--module", action="store_true",
                        help="the target is a module name, run as python -m")
    parser.add_argument("script", help="the script (or module, with -m) to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def main(args: argparse.Namespace) -> int:
    request = request_from_args(args)
    check_target(request)
    if not 0 <= args.grace_period <= threading.TIMEOUT_MAX:  # also refuses nan
        raise MpslaunchError(f"--grace_period must be from 0 to {threading.TIMEOUT_MAX:.0f} "
                             f"seconds, not {args.grace_period}")
    profile, _ = profiles.load_active(args.config_file, args.profile)
    plan = resolve(profile, request, machine_probe.probe(), os.environ)
    if args.dry_run:
        print(describe(plan))
        return 0
    for warning in plan.warnings:
        print(f"mpslaunch: warning: {warning}", file=sys.stderr)
    if not args.quiet:
        print(plan.summary(), file=sys.stderr, flush=True)
    return execute(plan, args.grace_period)


def request_from_args(args: argparse.Namespace) -> LaunchRequest:
    return LaunchRequest(
        target=args.script,
        target_args=tuple(args.script_args),
        module=args.module,
        cpu=args.cpu,
        device=args.device,
        mixed_precision=args.mixed_precision,
        num_processes=args.num_processes,
        num_machines=args.num_machines,
        machine_rank=args.machine_rank,
        main_process_ip=args.main_process_ip,
        main_process_port=args.main_process_port,
        rdzv_backend=args.rdzv_backend,
        max_restarts=args.max_restarts,
        log_dir=args.log_dir,
    )


def describe(plan: LaunchPlan) -> str:
    if plan.engine == "single":
        return plan.describe()
    from mpslaunch.run.torchrun import elastic as torchrun  # imports torch: only on the several-process path

    return torchrun.describe(plan)


def execute(plan: LaunchPlan, grace_seconds: float) -> int:
    if plan.engine == "single":
        return run_child(plan.command, plan.env, grace_seconds)
    from mpslaunch.run.torchrun import elastic as torchrun

    return torchrun.run(plan, grace_seconds)


# ---------------------------------------------------------------- the target must exist


def check_target(request: LaunchRequest) -> None:
    if request.module:
        _check_module(request.target)
    else:
        _check_script(Path(request.target))


def _check_script(path: Path) -> None:
    if path.is_dir():
        raise MpslaunchError(f"{path} is a folder; give the script to run (a .py file), "
                             "or -m and a module name")
    if not path.exists():
        raise MpslaunchError(f"no script at {path} (looked in {Path.cwd()}); check the path, "
                             "or use -m to run a module")
    if not os.access(path, os.R_OK):
        raise MpslaunchError(f"cannot read {path}; check its permissions")


def _check_module(name: str) -> None:
    """Like `python -m`, look in the current folder first; never import the module's package."""
    if not _module_exists(name, [os.getcwd(), *sys.path[1:]]):
        raise MpslaunchError(f"no module named {name!r} can be found from {Path.cwd()}; check "
                             "the name, or install the package that provides it")


def _module_exists(name: str, search_path: list[str]) -> bool:
    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return False
    spec = importlib.machinery.PathFinder.find_spec(parts[0], search_path)
    if spec is None:
        return importlib.util.find_spec(parts[0]) is not None  # built-in or frozen
    locations = list(spec.submodule_search_locations or [])
    for part in parts[1:]:
        if not locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, locations)
        if spec is None:
            return False
        locations = list(spec.submodule_search_locations or [])
    return True
