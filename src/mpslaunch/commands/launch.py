"""`mpslaunch launch`: flags -> LaunchRequest, the target checked, the plan resolved, then
printed (--dry-run) or run. Imports stay light: the one-process path never imports torch. On a
Mac the first plan for mps with a given Python, torch and macOS build asks torch in a child
(`probe_for`); later ones read the cached verdict.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import threading
from pathlib import Path

from mpslaunch import accelerate_config
from mpslaunch import machine as machine_probe
from mpslaunch import profile as profiles
from mpslaunch.errors import MpslaunchError
from mpslaunch.commands.accelerate_options import add_refused
from mpslaunch.commands.options import add_option, add_profile_options
from mpslaunch.machine import Machine
from mpslaunch.plan import (LaunchPlan, LaunchRequest, apply_flags, checks_main_address,
                            mps_problem, resolve)
from mpslaunch.profile import Profile
from mpslaunch.run.single import DEFAULT_GRACE_SECONDS, run_child

MPS_CHECK_TIMEOUT_SECONDS = 60.0  # a first `import torch` on a Mac can take a while
HELP = """\
Run a training script on the device this machine should use: mps on Apple silicon,
cuda on NVIDIA GPUs, cpu otherwise, unless the profile or an option says otherwise.
The script learns the plan from environment variables, so a script written for
Hugging Face Accelerate (Accelerator()) follows it unchanged and a plain PyTorch
script reads MPSLAUNCH_DEVICE. Several processes (cpu or cuda) and several machines
run through torch.distributed.run. Everything after the script belongs to the script.

examples:
  mpslaunch launch train.py --epochs 3
  mpslaunch launch --dry-run train.py            print the plan, run nothing
  mpslaunch launch --cpu --num_processes 2 train.py
"""

def add_arguments(parser: argparse.ArgumentParser) -> None:
    plan = parser.add_argument_group("what to run on")
    add_option(plan, "--cpu", action="store_true", help="run on the CPU whatever the machine has")
    add_option(plan, "--device", choices=profiles.DEVICES, help="auto (default), mps, cuda or cpu")
    add_option(plan, "--mixed_precision", choices=profiles.PRECISIONS, help="no, fp16 or bf16")
    add_option(plan, "--num_processes", type=int, metavar="N",
               help="processes on this machine (default: one per NVIDIA GPU, else 1)")
    add_option(plan, "--gpu_ids", metavar="IDS",
               help="NVIDIA GPUs to use, such as 0,1 (CUDA_VISIBLE_DEVICES for the ranks)")
    add_option(plan, "--multi_gpu", action="store_true",
               help="check that the plan is several GPUs (it is by default where there are)")
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
    add_option(multi, "--rdzv_timeout", type=int, metavar="SECONDS",
               help=f"how long the machines wait for each other before giving up "
                    f"(default {profiles.RDZV_TIMEOUT}, as torchrun)")
    add_option(multi, "--main_process_ip_via_nat", action="store_true", default=None,
               help="on machine 0: the main address reaches it through NAT or port forwarding, "
                    "so it is not one of its own (the rendezvous then listens on every interface)")
    add_option(multi, "--monitor_interval", type=float, metavar="SECONDS",
               help="how often torch checks the ranks (default 0.1)")
    accelerate = parser.add_argument_group("for the script's Accelerator (as accelerate launch sets them)")
    add_option(accelerate, "--dynamo_backend", choices=profiles.DYNAMO_BACKENDS, metavar="BACKEND",
               help=f"torch.compile backend: {', '.join(profiles.DYNAMO_BACKENDS)} (default no)")
    add_option(accelerate, "--dynamo_mode", choices=profiles.DYNAMO_MODES, metavar="MODE",
               help=f"torch.compile mode: {', '.join(profiles.DYNAMO_MODES)}")
    for name, text in (("--dynamo_use_fullgraph", "compile the whole graph, no graph breaks"),
                       ("--dynamo_use_dynamic", "trace dynamic shapes"),
                       ("--dynamo_use_regional_compilation", "compile repeated blocks once"),
                       ("--debug", "ACCELERATE_DEBUG_MODE: check collective operations")):
        add_option(accelerate, name, action="store_true", default=None, help=text)
    add_option(accelerate, "--num_cpu_threads_per_process", type=int, metavar="N",
               help="threads each process uses (OMP_NUM_THREADS)")
    output = parser.add_argument_group("output and profile")
    add_option(output, "--log_dir", metavar="DIR",
               help="also write the output (each rank's, with several) to files in DIR")
    output.add_argument("-t", "--tee", metavar="0-3",
                        help="accepted for Accelerate: every rank's output always reaches the console")
    output.add_argument("-q", "--quiet", action="store_true", help="no summary line before the run")
    add_profile_options(output)
    add_option(parser, "--grace_period", type=float, default=DEFAULT_GRACE_SECONDS, metavar="SECONDS",
               help="after Ctrl-C or SIGTERM, how long the script may take to stop (default 30)")
    add_option(parser, "--dry_run", action="store_true", help="print the plan and run nothing")
    parser.add_argument("-m", "--module", action="store_true",
                        help="the target is a module name, run as python -m")
    add_option(parser, "--no_python", action="store_true",
               help="run the target itself (an executable), not with python")
    add_refused(parser)
    parser.add_argument("script", nargs="?", help="the script (or module, with -m) to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def main(args: argparse.Namespace) -> int:
    if args.script is None:
        raise MpslaunchError("no script given: run `mpslaunch launch [options] script.py [script "
                             "args]`, or -m and a module name (see `mpslaunch launch --help`)")
    request = request_from_args(args)
    check_target(request)
    if not 0 <= args.grace_period <= threading.TIMEOUT_MAX:  # also refuses nan
        raise MpslaunchError(f"--grace_period must be from 0 to {threading.TIMEOUT_MAX:.0f} "
                             f"seconds, not {args.grace_period}")
    profile, path, translation = profiles.read_active(args.config_file, args.profile)
    machine = probe_for(profile, request, quiet=args.quiet)
    plan = resolve(profile, request, machine, os.environ)
    note = accelerate_note(path, translation, machine) if translation and not args.quiet else None
    if note:
        print(note, file=sys.stderr)
    for warning in translation.warnings if translation else ():
        print(f"mpslaunch: warning: {warning}", file=sys.stderr)
    if args.dry_run:
        print(describe(plan))
        if machine.is_mac:
            print(f"mps check:       {mps_check_text(machine)}")
        return 0
    announce(plan, quiet=args.quiet)
    return execute(plan, args.grace_period)


def announce(plan: LaunchPlan, quiet: bool = False, stream=None) -> None:
    """The plan's warnings on stderr, then (unless quiet) its one-line summary on `stream`."""
    for warning in plan.warnings:
        print(f"mpslaunch: warning: {warning}", file=sys.stderr)
    if not quiet:
        print(plan.summary(), file=stream or sys.stderr, flush=True)


def accelerate_note(path: Path, translation: accelerate_config.Translation,
                    machine: Machine) -> str:
    """One line for a profile file that is an Accelerate config, read as the profile it means."""
    note = f"mpslaunch: note: {path} was read as an Accelerate config file"
    if translation.basic_cpu and mps_problem(machine) is None:
        note += ("; its use_cpu: true is what `accelerate config default` writes on every Mac "
                 "without asking, so this runs on cpu as it says: give --device mps to use the "
                 "GPU, or import it with `mpslaunch config --from-accelerate`")
    return note


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
        main_process_ip_via_nat=args.main_process_ip_via_nat,
        main_process_port=args.main_process_port,
        rdzv_backend=args.rdzv_backend,
        rdzv_timeout=args.rdzv_timeout,
        max_restarts=args.max_restarts,
        log_dir=args.log_dir,
        gpu_ids=args.gpu_ids,
        dynamo_backend=args.dynamo_backend,
        dynamo_mode=args.dynamo_mode,
        dynamo_use_fullgraph=args.dynamo_use_fullgraph,
        dynamo_use_dynamic=args.dynamo_use_dynamic,
        dynamo_use_regional_compilation=args.dynamo_use_regional_compilation,
        debug=args.debug,
        multi_gpu=args.multi_gpu,
        num_cpu_threads_per_process=args.num_cpu_threads_per_process,
        tee=args.tee,
        monitor_interval=args.monitor_interval,
        no_python=args.no_python,
    )


def probe_for(profile: Profile, request: LaunchRequest, quiet: bool = False) -> Machine:
    """This machine: with its network addresses when it is machine 0 of several (checked against
    --main_process_ip); on a Mac where the plan would be mps and torch was never asked about this
    Python, torch and macOS build, with torch's verdict (asked once, then cached)."""
    machine = machine_probe.probe()
    settings = apply_flags(profile, request)
    if checks_main_address(settings):
        machine = machine_probe.with_addresses(machine, settings.main_process_ip)
    if not machine.is_mac or machine.mps_answer is not None:
        return machine
    if resolve(profile, request, machine, os.environ).device != "mps":
        return machine
    if not quiet:
        print("mpslaunch: checking once that torch can use mps with this Python, torch and macOS "
              "(the answer is kept for later launches)", file=sys.stderr, flush=True)
    machine = machine_probe.verify_mps(machine, MPS_CHECK_TIMEOUT_SECONDS)
    if machine.mps_answer is None:
        print(f"mpslaunch: warning: torch's mps check gave no answer within "
              f"{MPS_CHECK_TIMEOUT_SECONDS:g} s; planning on the platform facts alone "
              "(`mpslaunch env` checks again)", file=sys.stderr, flush=True)
    return machine


def mps_check_text(machine: Machine) -> str:
    """The dry run's line about torch's verdict on mps."""
    if machine.mps_answer is None:
        return "not asked (only a plan for mps asks torch; `mpslaunch env` asks now)"
    return f"{machine.mps_answer.describe()}; `mpslaunch env` checks again"


def describe(plan: LaunchPlan) -> str:
    if plan.engine == "single":
        return plan.describe()
    from mpslaunch.run.torchrun import elastic as torchrun  # imports torch: only on the several-process path

    return torchrun.describe(plan)


def execute(plan: LaunchPlan, grace_seconds: float) -> int:
    if plan.engine == "single":
        return run_child(plan.command, plan.env, grace_seconds, plan.log_dir)
    if threading.current_thread() is not threading.main_thread():
        raise MpslaunchError("several processes of a script are started from the main thread "
                             "only (stopping them needs its signal handlers); call from the main "
                             "thread, or run one process here")
    from mpslaunch.run.torchrun import elastic as torchrun

    return torchrun.run(plan, grace_seconds)


# ---------------------------------------------------------------- the target must exist


def check_target(request: LaunchRequest) -> None:
    if request.module:
        _check_module(request.target)
    elif request.no_python:
        _check_executable(request.target)
    else:
        _check_script(Path(request.target))


def _check_executable(name: str) -> None:
    import shutil  # only with --no_python

    if shutil.which(name) is None:
        raise MpslaunchError(f"{name} is not an executable file (--no_python runs it directly, "
                             "looking on PATH when the name has no '/'); check the path and its "
                             "permissions, or drop --no_python")


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
