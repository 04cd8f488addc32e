"""Several processes or machines: PyTorch's elastic launcher, torch.distributed.run, in our process.

`plan.resolve` chooses this path when num_processes > 1 or num_machines > 1 (never on mps: it
refuses that first). We build torchrun's own command line (torchrun_args), let torch parse it
(`torch.distributed.run.parse_args` + `config_from_args`) and run `elastic_launch` in the
launcher process, so we see the failure that torch's agent reports and no process group of our
own exists: each rank is `python -u script.py args...` with torchrun's RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, plus plan.env (MPSLAUNCH_*,
ACCELERATE_*, OMP_NUM_THREADS), so an unmodified Accelerate script sees MULTI_CPU (gloo) with
--cpu and MULTI_GPU (nccl, one GPU per rank) on cuda. torch is imported only on this path.

- One machine: everything listens on 127.0.0.1 only (torchrun_store); port 0 = a free port.
- Several machines: --num_machines, --machine_rank, --main_process_ip, --main_process_port,
  --rdzv_backend static|c10d, --max_restarts map onto torchrun's options (torchrun_args).
- Console: every line of every rank, prefixed `[rankN] ` (torchrun's --tee 3; torchrun_console
  keeps the lines whole). --log_dir DIR: torch's per-rank files
  DIR/<run id>_*/attempt_<n>/<local rank>/{stdout,stderr}.log; without it they go to a
  temporary folder, kept only when a rank failed (the summary names the file).
- Exit code: the first failing rank's own code, 128+N if signal N killed it; 128+N when signal N
  stopped the launcher. One summary line names the rank and its log files; torch's own log and
  error dump are silenced (set LOGLEVEL=INFO to see them), and no launcher traceback is printed.
- Signals (torchrun_signals): SIGINT/SIGTERM/SIGHUP/SIGQUIT stop every rank with that signal;
  ranks still there after the grace period, or at a second signal, are SIGKILLed; SIGUSR1/2
  are forwarded to every rank. A grace period above 30 s needs a torch whose LaunchConfig has
  `shutdown_timeout` (2.14 has it; older ones SIGKILL after a fixed 30 s). When a rank fails,
  torch stops the others with SIGTERM and its own 30 s before SIGKILL, whatever the grace.
- Leftovers: after the run, whatever is left of the ranks is SIGKILLed and reaped, on Linux also
  what a rank that exited left running (on macOS that is not found). A launcher killed with
  SIGKILL cannot stop its ranks (torch starts them in sessions of their own, without a
  parent-death signal); every other way of ending the launcher stops them.
- torch versions: only options and fields that torch 2.11 has (the oldest seen on our machines)
  are relied on; newer ones (shutdown_timeout) are used where present.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
import tempfile
import uuid
from contextlib import contextmanager, nullcontext
from typing import Iterator, Mapping

from mpslaunch.errors import MpslaunchError
from mpslaunch.plan import LaunchPlan
from mpslaunch.run.processes import exit_code
from mpslaunch.run.torchrun.console import whole_rank_lines
from mpslaunch.run.torchrun.args import (FREE_PORT, LINE_PREFIX, LINE_PREFIX_VARIABLE, Rendezvous,
                                     arguments, launcher_environment, rank_environments,
                                     rendezvous_for)
from mpslaunch.run.torchrun.outcome import failure_summary, from_torch, stopped_summary
from mpslaunch.run.torchrun.signals import LauncherSignals, Stopped, adopt_orphans, sweep


class LaunchFailed(MpslaunchError):
    """torch's launcher failed before any rank could (a rendezvous that never completed, ...)."""

    exit_code = 1


# ---------------------------------------------------------------- --dry-run


def describe(plan: LaunchPlan) -> str:
    rendezvous = rendezvous_for(plan, run_id="mpslaunch-<new for each run>")
    port_text = FREE_PORT if rendezvous.local and rendezvous.port == 0 else None
    argv = arguments(plan, rendezvous, port_text, plan.log_dir)
    python = plan.command[0]
    lines = [
        plan.describe(),
        "torch.distributed.run (run inside the launcher process; the equivalent command):",
        f"  {LINE_PREFIX_VARIABLE}={shlex.quote(LINE_PREFIX)} "
        + shlex.join([python, "-m", "torch.distributed.run", *argv]),
        "  each rank runs: " + shlex.join([python, "-u", *plan.command[1:]]),
        *(f"  note: {note}" for note in _notes(plan, rendezvous)),
        "every rank also gets:",
        *(f"  {key}={value}" for key, value in sorted(_added(plan, rendezvous).items())),
    ]
    for table in rank_environments(plan, rendezvous, port_text):
        lines.append(f"local rank {table['LOCAL_RANK']}: "
                     + " ".join(f"{key}={value}" for key, value in table.items()))
    return "\n".join(lines)


def _added(plan: LaunchPlan, rendezvous: Rendezvous) -> dict[str, str]:
    full = launcher_environment(plan, rendezvous, os.environ)
    return {key: value for key, value in full.items() if key not in plan.env}


def _notes(plan: LaunchPlan, rendezvous: Rendezvous) -> list[str]:
    if rendezvous.local:
        notes = ["the rendezvous store listens on 127.0.0.1 only (torchrun itself would listen on "
                 "every interface)"]
        if plan.settings.rdzv_backend != "static":
            notes.append(f"rdzv_backend {plan.settings.rdzv_backend} is for several machines; "
                         "one machine uses a static rendezvous")
        return notes
    notes = []
    if plan.settings.main_process_port == 0:
        notes.append(f"port 0 cannot be agreed between machines: using {rendezvous.port}")
    if rendezvous.backend == "static" and rendezvous.node_rank == 0:
        notes.append(f"this machine hosts the rendezvous store, on {rendezvous.address} only when "
                     "that is one of its addresses")
    return notes


# ---------------------------------------------------------------- running


def run(plan: LaunchPlan, grace_seconds: float) -> int:
    """Run the plan through torch's elastic agent; return the launcher's exit code."""
    rendezvous = rendezvous_for(plan, run_id=f"mpslaunch-{uuid.uuid4().hex[:12]}")
    env = launcher_environment(plan, rendezvous, os.environ)
    _line_buffered(sys.stdout)
    with LauncherSignals(grace_seconds) as signals, adopt_orphans(), _LogFolder(plan.log_dir) as logs:
        try:
            code = _launch(plan, rendezvous, env, logs, grace_seconds, signals)
        except Stopped as stop:  # before torch's agent took the signals over
            code = 128 + stop.signum
            _say(stopped_summary(stop.signum))
        finally:
            signals.quiet()
            sweep()
    return code


def _launch(plan: LaunchPlan, rendezvous: Rendezvous, env: Mapping[str, str], logs: "_LogFolder",
            grace_seconds: float, signals: LauncherSignals) -> int:
    _check_torch_distributed()
    with _quiet_torch_logs(), _environment({**env, LINE_PREFIX_VARIABLE: LINE_PREFIX}), \
            _store(rendezvous) as port:
        elastic = _Elastic()  # inside: on macOS its import warns about fd redirects we never use
        args = elastic.run.parse_args(arguments(plan, rendezvous, str(port), logs.path))
        config, entrypoint, entry_args = elastic.run.config_from_args(args)
        config.log_line_prefix_template = LINE_PREFIX  # whatever this torch reads it from
        if hasattr(config, "shutdown_timeout"):  # newer torch; older ones wait a fixed 30 s
            config.shutdown_timeout = int(-(-grace_seconds // 1))  # whole seconds, rounded up
        try:
            with whole_rank_lines():
                elastic.launch(config, entrypoint)(*entry_args)
        except elastic.ChildFailedError as failed:
            signals.quiet()
            failure = from_torch(*failed.get_first_failure(), logs.path, rendezvous.run_id)
            logs.keep = True  # the summary points into it
            _say(failure_summary(failure))
            return exit_code(failure.exitcode)
        except elastic.SignalException as stop:
            signals.quiet()
            _say(stopped_summary(int(stop.sigval)))
            return 128 + int(stop.sigval)
        except Exception as error:  # rendezvous timeouts, unreachable machine 0, ...
            raise LaunchFailed(f"torch.distributed.run failed before the ranks finished: "
                               f"{type(error).__name__}: {_first_line(error)}") from None
    return 0


class _Elastic:
    """The few torch names this path uses, imported together (and only here)."""

    def __init__(self):
        import torch.distributed.run as run
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import elastic_launch

        self.run, self.launch = run, elastic_launch
        self.ChildFailedError, self.SignalException = ChildFailedError, SignalException


def _check_torch_distributed() -> None:
    try:
        import torch.distributed
    except ImportError:
        raise MpslaunchError(f"several processes run through torch.distributed.run, and torch is "
                             f"not installed for {sys.executable}; run `pip install torch`") from None
    if not torch.distributed.is_available():
        raise MpslaunchError(f"this torch build ({torch.__version__}) has no torch.distributed, "
                             "so it cannot run several processes; install an official torch wheel")


def _store(rendezvous: Rendezvous):
    """Where the rendezvous store listens (torchrun_store); None of ours: torch's own."""
    from mpslaunch.run.torchrun.store import machine0_store, store_on

    if rendezvous.local:
        return store_on(rendezvous.address, rendezvous.port)
    if rendezvous.backend == "static" and rendezvous.node_rank == 0:
        return machine0_store(rendezvous.address, rendezvous.port)
    return nullcontext(rendezvous.port)


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """The ranks inherit the launcher's environment: put plan.env there for the run."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """torch's agent logs every step and dumps the failure; we print one summary instead.

    torch's logging setup gives "torch.distributed" (and a few of its children) a stderr handler
    of their own; for the run, those handlers are swapped for a silent one.
    """
    if "LOGLEVEL" in os.environ:  # torchrun's own knob: the user wants torch's log
        yield
        return
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name == "torch.distributed" or name.startswith("torch.distributed.")]
    saved = {logger: logger.handlers for logger in loggers if logger.handlers}
    for logger in saved:
        logger.handlers = [logging.NullHandler()]
    try:
        yield
    finally:
        for logger, handlers in saved.items():
            logger.handlers = handlers


class _LogFolder:
    """--log_dir as given, else a temporary folder, kept only when a failure summary names it."""

    def __init__(self, log_dir: str | None):
        self.given = log_dir
        self.path = ""
        self.keep = False

    def __enter__(self) -> "_LogFolder":
        self.path = self.given or tempfile.mkdtemp(prefix="mpslaunch-logs-")
        return self

    def __exit__(self, *_exc) -> None:
        if not self.given and not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)


def _line_buffered(stream) -> None:
    # The ranks' lines reach the console through our stdout: do not hold them in a buffer.
    try:
        stream.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]
