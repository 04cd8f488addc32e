"""Several processes or machines: torch's elastic_launch, run inside the launcher process.

We build torchrun's own command line (args.py), let torch parse it, and run elastic_launch here,
so the first failing rank's own exit code and log come back. torch is imported only on this path.
The contracts it keeps (console, logs, exit codes, restarts, signals, leftovers, the wait for
other machines) are in docs/design.md.
"""

from __future__ import annotations

import gc
import logging
import os
import shlex
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext

from mpslaunch.machine import endpoint
from mpslaunch.output import MpslaunchError, error_line, one_line, shell_words
from mpslaunch.plan import LaunchPlan
from mpslaunch.run.companion import Watch, watching
from mpslaunch.run.logdir import keep_failed, temporary_log_dir, usable_log_dir
from mpslaunch.run.processes import (
    RUN_MARKER,
    adopt_orphans,
    child_pids,
    environment,
    exit_code,
    new_run_id,
    rank_pids,
)
from mpslaunch.run.torch_internals import (
    Elastic,
    bound_store,
    c10d_ranks_share_the_rendezvous_store,
    failures_logged,
    graceful_stops,
    missing,
    torch_takes_no_signals,
    tune,
)
from mpslaunch.run.torchrun.args import (
    FREE_PORT,
    LINE_PREFIX,
    LINE_PREFIX_VARIABLE,
    Rendezvous,
    arguments,
    launcher_environment,
    rank_environments,
    rendezvous_for,
)
from mpslaunch.run.torchrun.attempts import Attempts
from mpslaunch.run.torchrun.console import whole_rank_lines
from mpslaunch.run.torchrun.gate import Gate, agreed_terms
from mpslaunch.run.torchrun.outcome import (
    failure_summary,
    from_torch,
    largest_own_failure,
    other_endings,
    stopped_ranks,
    stopped_summary,
)
from mpslaunch.run.torchrun.signals import LauncherSignals, Stopped


class LaunchFailed(MpslaunchError):
    """torch's launcher failed before any rank could (a rendezvous that never completed, ...)."""

    exit_code = 1


# ---------------------------------------------------------------- --dry_run


def describe(plan: LaunchPlan) -> str:
    """What --dry_run prints: the plan, torchrun's equivalent command and what each rank gets."""
    rendezvous = rendezvous_for(plan, run_id="mpslaunch-<new for each run>")
    port_text = FREE_PORT if rendezvous.local and rendezvous.port == 0 else None
    argv = arguments(plan, rendezvous, port_text, plan.log_dir)
    python = sys.executable if plan.no_python else plan.command[0]  # torchrun runs in the launcher
    lines = [
        plan.describe(),
        "torch.distributed.run (run inside the launcher process; the equivalent command):",
        f"  {LINE_PREFIX_VARIABLE}={shlex.quote(LINE_PREFIX)} "
        + shell_words([python, "-m", "torch.distributed.run", *argv]),
        "  each rank runs: "
        + shell_words(plan.command if plan.no_python else [python, "-u", *plan.command[1:]]),
        *(f"  note: {note}" for note in _notes(plan, rendezvous)),
        "every rank also gets:",
        *(f"  {key}={one_line(value)}" for key, value in sorted(_added(plan, rendezvous).items())),
    ]
    for table in rank_environments(plan, rendezvous, port_text):
        lines.append(
            f"local rank {table['LOCAL_RANK']}: "
            + " ".join(f"{key}={value}" for key, value in table.items())
        )
    return "\n".join(lines)


def _store_listens_on(plan: LaunchPlan, rendezvous: Rendezvous) -> str:
    if plan.settings.main_process_ip_via_nat:
        return "every interface (--main_process_ip_via_nat)"
    if not bound_store(torch_version(), rendezvous.address):
        return (
            f"every interface, on port {rendezvous.port} (on torch {torch_version()} the store "
            "that listens on one address aborts when a machine's address has no name; other "
            "releases listen on the address alone)"
        )
    return f"{endpoint(rendezvous.address, rendezvous.port)} only"


def _c10d_store(version: str) -> str:
    """What serves the ranks' store with c10d, on this torch (torch_internals)."""
    if c10d_ranks_share_the_rendezvous_store(version):
        return (
            f"with c10d, torch {version}'s agent gives the ranks the rendezvous store itself "
            "(nothing else listens for them)"
        )
    return (
        "with c10d, the machine that gets rank 0 at the rendezvous also serves a store for "
        "the ranks (torch's agent, or rank 0 before torch 2.5), on every interface, on a "
        "port torch picks; --rdzv_backend static keeps the ranks on the rendezvous store"
    )


def torch_version() -> str:
    """The installed torch's release, without its build tag (2.5.1, not 2.5.1+cu124)."""
    import torch  # imported already: this path runs torch's launcher

    return torch.__version__.split("+")[0]


def _added(plan: LaunchPlan, rendezvous: Rendezvous) -> dict[str, str]:
    full = launcher_environment(plan, rendezvous, os.environ)
    return {key: value for key, value in full.items() if key not in plan.env}


def _notes(plan: LaunchPlan, rendezvous: Rendezvous) -> list[str]:
    if rendezvous.local:
        notes = [
            "the rendezvous store listens on 127.0.0.1 only (torchrun itself would listen on "
            "every interface)"
        ]
        if plan.settings.rdzv_backend != "static":
            notes.append(
                f"rdzv_backend {plan.settings.rdzv_backend} is for several machines; "
                "one machine uses a static rendezvous"
            )
        return notes
    notes = []
    if plan.settings.main_process_port == 0:
        notes.append(f"port 0 cannot be agreed between machines: using {rendezvous.port}")
    if plan.settings.machine_rank == 0:
        notes.append(
            f"this machine (machine 0) serves the rendezvous store, on "
            f"{_store_listens_on(plan, rendezvous)}"
        )
    if rendezvous.backend == "c10d":
        notes.append(_c10d_store(torch_version()))
    notes.append(
        f"each machine waits for the others for up to {plan.settings.rdzv_timeout} s "
        "(--rdzv_timeout); Ctrl-C stops the wait"
    )
    return notes


# ---------------------------------------------------------------- running


def run(plan: LaunchPlan, watch: Watch, held: Sequence[int]) -> int:
    """Run the plan through torch's elastic agent; return the launcher's exit code. `held`:
    stopping signals that came before the run's handlers (supervisor.holding_stops)."""
    # The marker is this launcher's own: the rendezvous id is shared by all machines of a run,
    # some of which may share this host.
    run_id = new_run_id()
    with watching(watch, lambda: rank_pids(run_id)) as companion:
        code = _run(plan, run_id, companion.watch.report, held)
    companion.ended(code, log_folder=plan.log_dir)
    return code


def _run(plan: LaunchPlan, run_id: str, report: bool, held: Sequence[int]) -> int:
    rendezvous = _new_rendezvous(plan)
    started, callers_children = time.time(), child_pids()
    env = {**launcher_environment(plan, rendezvous, os.environ), RUN_MARKER: run_id}
    _line_buffered(sys.stdout)
    grace_seconds = plan.grace_period
    with (
        LauncherSignals(
            grace_seconds, run_id, _say if report else None, plan.delivers_signals
        ) as signals,
        adopt_orphans(),
        _LogFolder(plan.log_dir) as logs,
    ):
        for signum in held:
            signals.watcher.stop(signum)
        try:
            code = _launch(plan, rendezvous, env, logs, grace_seconds, signals)
        except Stopped as stop:  # the supervisor's first stopping signal: the code and the words
            code = 128 + stop.signum
            _say(
                stop.summary
                or stopped_summary(stop.signum, signals.watcher.killed_at, signals.ranks_started)
            )
        finally:
            signals.quiet()
            signals.watcher.clean_up(started, callers_children)
    # The launcher is about to exit: with torch loaded, the interpreter's last garbage collection
    # makes that exit slow, and nothing of the launcher's waits on it.
    gc.freeze()
    return code


def _launch(
    plan: LaunchPlan,
    rendezvous: Rendezvous,
    env: Mapping[str, str],
    logs: _LogFolder,
    grace_seconds: float,
    signals: LauncherSignals,
) -> int:
    signals.check()  # a stop before the run's handlers: no torch, no ranks
    _check_torch_distributed()
    signals.check()  # a stop that came while torch was imported
    with (
        _quiet_torch_logs(),
        environment({**env, LINE_PREFIX_VARIABLE: LINE_PREFIX}),
        _store(plan, rendezvous) as (port, store),
    ):
        if not rendezvous.local:
            with signals.interruptible():
                Gate(
                    plan.settings.machine_rank,
                    plan.settings.num_machines,
                    rendezvous.address,
                    port,
                    plan.settings.rdzv_timeout,
                    _say,
                    agreed_terms(
                        plan.device,
                        plan.settings.mixed_precision,
                        plan.settings.num_processes,
                        plan.settings.num_machines,
                    ),
                ).wait(store)
        elastic = Elastic()  # inside: on macOS its import warns about fd redirects we never use
        args, config, entrypoint, entry_args = elastic.config(
            arguments(plan, rendezvous, str(port), logs.path), LINE_PREFIX
        )
        tune(config, grace_seconds)
        attempts = Attempts(plan.settings.max_restarts, _say)

        def starting(envs: dict[int, dict[str, str]]) -> None:
            signals.ranks_starting()  # no ranks after a stop
            attempts.started(envs)

        config.logs_specs = elastic.logs_specs(args, starting)
        for line in missing():
            _say(f"mpslaunch: note: {line}")
        try:
            with (
                whole_rank_lines(),
                failures_logged(attempts.failed),
                graceful_stops(grace_seconds, signals) as stops,
                torch_takes_no_signals(),
                signals.interruptible(),
            ):
                elastic.launch(config, entrypoint)(*entry_args)
            signals.check()
        except elastic.ChildFailedError as failed:
            signals.check()  # the ranks ended as the run was being stopped: a stop
            signals.quiet()
            rank, first = failed.get_first_failure()
            # srun reports its tasks' largest code (it needs to know which ranks were stopped)
            in_slurm = plan.cluster is not None and stops.followed
            if in_slurm:
                rank = largest_own_failure(failed.failures, stops.stopped)
                first = failed.failures[rank]
            failure = from_torch(rank, first, logs.path, rendezvous.run_id)
            logs.keep = True  # the summary points into it
            others = other_endings(
                failure, failed.failures, plan.settings.num_processes, stops.stopped
            )
            stopped = stopped_ranks(failure, stops.stopped) if stops.followed else None
            summary = failure_summary(
                failure,
                others,
                stopped,
                grace_seconds,
                fault_handler=bool(os.environ.get("PYTHONFAULTHANDLER")),
                largest=in_slurm,
            )
            _say("; ".join(filter(None, [summary, attempts.counted()])))
            return exit_code(failure.exitcode)
        except Exception as error:  # rendezvous timeouts, unreachable machine 0, ...
            signals.check()
            raise LaunchFailed(
                f"torch.distributed.run failed before the ranks finished: {error_line(error)}"
            ) from None
    if attempts.restarts:
        _say(f"mpslaunch: every rank finished, after {attempts.counted()}")
    return 0


def run_function(plan: LaunchPlan, function, args: tuple, start_method: str) -> dict[int, object]:
    """The Python API with several processes: `function(*args)` in each rank, through the same
    rendezvous, store and environment as run(); torch's own errors (ChildFailedError) propagate.
    Returns each of this machine's ranks' return value, by global rank. The caller's signal
    handlers are back afterwards; a stopping signal during the run stops the ranks, then reaches
    the caller's own handler (KeyboardInterrupt for Ctrl-C, by default)."""
    _check_torch_distributed()
    try:
        return _run_function(plan, function, args, start_method)
    except Stopped as stop:
        signal.raise_signal(stop.signum)
        raise MpslaunchError(f"the processes were stopped by {stop} before they finished") from None


def _run_function(plan: LaunchPlan, function, args: tuple, start_method: str) -> dict[int, object]:
    rendezvous = _new_rendezvous(plan)
    env = launcher_environment(plan, rendezvous, os.environ)
    with (
        LauncherSignals(plan.grace_period, new_run_id()) as signals,
        environment({**env, LINE_PREFIX_VARIABLE: LINE_PREFIX}),
        _store(plan, rendezvous) as (port, _),
        _LogFolder(plan.log_dir) as logs,
    ):
        elastic = Elastic()
        _, config, _, _ = elastic.config(
            arguments(plan, rendezvous, str(port), logs.path), LINE_PREFIX
        )
        config.start_method = start_method
        in_ranks = signals.forked(function) if start_method == "fork" else function
        try:
            with (
                whole_rank_lines(),
                graceful_stops(plan.grace_period, signals),
                torch_takes_no_signals(),
                signals.interruptible(),
            ):
                results = elastic.launch(config, in_ranks)(*args)
            signals.check()
        except Exception:
            signals.check()
            raise
        finally:
            signals.quiet()
        return dict(sorted(results.items()))


def _new_rendezvous(plan: LaunchPlan) -> Rendezvous:
    return rendezvous_for(plan, run_id=f"mpslaunch-{uuid.uuid4().hex[:12]}")


def _check_torch_distributed() -> None:
    try:
        import torch.distributed
    except ImportError:
        raise MpslaunchError(
            f"several processes run through torch.distributed.run, and torch is "
            f"not installed for {sys.executable}; run `pip install torch`"
        ) from None
    if not torch.distributed.is_available():
        raise MpslaunchError(
            f"this torch build ({torch.__version__}) has no torch.distributed, "
            "so it cannot run several processes; install an official torch wheel"
        )


def _store(plan: LaunchPlan, rendezvous: Rendezvous):
    """The rendezvous store this machine serves (store.py): (port, store), or the port and
    None on machines other than machine 0, which connect to machine 0's."""
    from mpslaunch.run.torchrun.store import EVERY_INTERFACE, store_on

    if rendezvous.local:
        return store_on(rendezvous.address, rendezvous.port)
    if plan.settings.machine_rank == 0:
        listen = EVERY_INTERFACE if plan.settings.main_process_ip_via_nat else None
        return store_on(rendezvous.address, rendezvous.port, listen)
    return nullcontext((rendezvous.port, None))


@contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """torch's agent logs every step and dumps the failure; we print one summary instead.

    torch's logging setup gives "torch.distributed" (and a few of its children) a stderr handler
    of their own; for the run, those handlers are swapped for a silent one.
    """
    if "LOGLEVEL" in os.environ:  # torchrun's own knob: the user wants torch's log
        yield
        return
    loggers = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name == "torch.distributed" or name.startswith("torch.distributed.")
    ]
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

    def __enter__(self) -> _LogFolder:
        self.path = str(usable_log_dir(self.given)) if self.given else temporary_log_dir()
        return self

    def __exit__(self, *_exc) -> None:
        if not self.given and self.keep:
            keep_failed(self.path)
        elif not self.given:
            shutil.rmtree(self.path, ignore_errors=True)


def _line_buffered(stream) -> None:
    # The ranks' lines reach the console through our stdout: do not hold them in a buffer.
    try:
        stream.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
