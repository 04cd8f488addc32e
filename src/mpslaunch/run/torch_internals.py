"""What the several-process path takes from torch beyond its public API, in one place, so that
what a new torch release may break is seen at a glance. Checked against torch 2.4.1, 2.5.1, 2.8.0,
2.14.1 and 2.15.0 (tests/compat), the store's reverse lookups also on 2.6.0; `missing()` names
what the installed torch lacks.

- torch.distributed.run's own parsing (parse_args, config_from_args) turns the command line the
  plan makes into elastic_launch's LaunchConfig (`Elastic.config`);
- LaunchConfig's shutdown_timeout (newer torch only), its log_line_prefix_template and
  logs_specs are set after parsing (`Elastic.config`, `tune`);
- PContext.start takes over SIGTERM, SIGINT, SIGHUP and SIGQUIT (from torch 2.10 those that
  signals_to_handle names), even one the launcher was started with ignored (nohup's SIGHUP), and
  does not give them back (a program calling mpslaunch.launch() would lose its Ctrl-C); its
  handler raises SignalException, an Exception, which torch's own `except Exception` swallows
  where it lands in the log tailers' stop (every restart goes through it); torch 2.4 fails
  outside the main thread. For the run, the `signal` module that torch's multiprocessing module
  sees sets no handler at all, on every release: the launcher's own stay
  (`torch_takes_no_signals`);
- DefaultLogsSpecs.reify is called with each attempt's rank environments, before its ranks
  start (`Elastic.logs_specs`);
- PContext.close and PContext.wait are swapped for the run (`graceful_stops`). close records how
  the ranks it stopped ended, as torch before 2.10 reports only the ranks that failed before the
  stop, and sends the stop's own signal (the launcher's `death_signal`); after a stopping signal
  SLURM delivered to every rank it only waits, then kills what is left; it closes the log files
  each rank's SubprocessHandler opened (`_stdout`, `_stderr`): torch closes them only for a rank
  it signals, and leaves those of ranks that ended by themselves to the garbage collector (a
  ResourceWarning each, an error under PYTHONWARNINGS=error). wait (torch's agent looking at the
  ranks it holds) and the end of close tell the launcher that unwinding torch's agent is safe
  there (`safe_point`);
- TCPStore takes a listening socket (master_listen_fd), and with multi_tenant the store the
  launcher serves is the one torch's static rendezvous finds on that port (`serve_store`); the
  libuv store takes one from torch 2.8 (pytorch/pytorch#150215), and raises NotImplementedError
  before, where the store without libuv takes it. On torch 2.5 the store without libuv names
  each connecting address through a reverse lookup, and where that lookup fails (an address
  without a name in /etc/hosts, DNS unreachable) its thread throws "failed to format addr,
  unknown family=0" and the process aborts (SIGABRT); 2.4 and 2.6 do not. There, a store other
  machines reach is the libuv store, which takes no socket and listens on every interface
  (`bound_store`); one on the loopback keeps its socket (127.0.0.1 is named in /etc/hosts);
- with c10d, torch 2.5's agent hands the ranks the rendezvous store itself; 2.4 (rank 0's
  process) and 2.6 and later (the agent) serve the ranks a store of their own, on a free port,
  on every interface (`c10d_ranks_share_the_rendezvous_store`);
- torch 2.4's TCPStore client connects without a handshake (2.14.1's and 2.15.0's shake hands in
  the constructor): a client is handed out only after the store has answered a question
  (`connect_store`);
- ChildFailedError (get_first_failure, failures) ends a failed run;
- the agent logs the failure that ends an attempt to the FAILURE_LOGGER as "failed (exitcode: N)
  local_rank: R ...", the code and rank its first two arguments (`failures_logged`);
- torch's --tee tailer (tail_log.tail_logfile, which TailLog runs for each rank) reads a rank's
  file a whole line at a time, however long: a rank that writes 250 MB without a newline puts
  that much (and its copies) in the launcher at once. For the run it reads at most a given
  number of characters at a time (`tails_in_pieces`), so the console wrapper's bound holds, and
  looks at whether the rank has ended before each read (torch does after it up to 2.14).

The grace period when a rank fails: the other ranks get --grace_period to stop, not torch's 30 s.
When a rank fails (or before a restart), torch's agent stops the other ranks through its
process context's close(): SIGTERM, a wait, then SIGKILL. On that path torch waits a fixed
30 s whatever its shutdown_timeout says, so a rank that saves a checkpoint for 40 s is killed
mid-save, and a short --grace_period is not kept either. For the run, close() waits the
launcher's grace period instead, and remembers which ranks were still running when it was
called: those were stopped by the launcher; the others had ended by themselves.
"""

from __future__ import annotations

import datetime
import inspect
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any

STORE_TIMEOUT = datetime.timedelta(seconds=900)  # torchrun's default rendezvous timeout
ANSWERS = "mpslaunch/answers"  # a key no one sets: connect_store asks the store about it
LIBUV_TAKES_A_LISTENING_SOCKET = (2, 8, 0)  # the first release whose libuv store accepts one
NAMELESS_PEER_ABORTS = ((2, 5, 0), (2, 6, 0))  # releases [from, to) whose store without libuv
# aborts at a connection from an address without a name (checked: 2.4.1 no, 2.5.1 yes, 2.6.0 no)


def release(version: str) -> tuple[int, int, int] | None:
    """torch.__version__ as (major, minor, patch); None for a pre-release or a build from source
    ("2.8.0a0+git..."), which may predate its release's changes."""
    found = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(\+.*)?", version)
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def libuv_takes_a_listening_socket(version: str) -> bool:
    known = release(version)
    return known is not None and known >= LIBUV_TAKES_A_LISTENING_SOCKET


def _in_torch_2_5(version: str) -> bool:
    known = release(version)
    return known is not None and NAMELESS_PEER_ABORTS[0] <= known < NAMELESS_PEER_ABORTS[1]


def bound_store(version: str, address: str) -> bool:
    """Whether the store for `address` is served on a socket the launcher binds to that address
    alone; False: torch's libuv store on every interface (torch 2.5, other machines' address)."""
    from mpslaunch.machine import is_loopback

    return not _in_torch_2_5(version) or is_loopback(address)


def c10d_ranks_share_the_rendezvous_store(version: str) -> bool:
    return _in_torch_2_5(version)


def missing() -> list[str]:
    """What the launcher's promises rest on and the installed torch lacks, one line each."""
    from torch.distributed.elastic.multiprocessing import api

    lines = []
    if not _takes_a_timeout(getattr(api, "PContext", None)):
        lines.append(
            "torch's PContext.close(death_sig, timeout) is not there: when a rank fails, "
            "the others get torch's own time to stop, not --grace_period, and the summary "
            "judges them by their exit codes"
        )
    if getattr(api, "signal", None) is not signal:
        lines.append(
            "torch takes over SIGTERM, SIGINT, SIGHUP and SIGQUIT for the run, even a "
            "signal the launcher was started with ignored (nohup's SIGHUP), and a stop "
            "may be lost while it restarts the ranks"
        )
    return lines


class Elastic:
    """The torch names this path uses, imported together (and only here)."""

    def __init__(self):
        import torch.distributed.run as run
        from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import elastic_launch

        self.run, self.launch = run, elastic_launch
        self.ChildFailedError = ChildFailedError
        self.DefaultLogsSpecs, self.Std = DefaultLogsSpecs, Std

    def config(self, argv: list[str], line_prefix: str):
        """torch.distributed.run's own parsing of `argv`: (args, config, entrypoint, entrypoint's
        args), the config with the ranks' line prefix."""
        args = self.run.parse_args(argv)
        config, entrypoint, entry_args = self.run.config_from_args(args)
        config.log_line_prefix_template = line_prefix  # whatever this torch reads it from
        return args, config, entrypoint, entry_args

    def logs_specs(self, args, started: Callable[[dict[int, dict[str, str]]], None]):
        """torch's own log folders (as config_from_args makes them); `started(envs)` is called
        with each attempt's rank environments, by local rank, as torch starts them."""
        logs_specs: Any = self.DefaultLogsSpecs  # this torch's class

        class AnnouncingLogsSpecs(logs_specs):
            def reify(self, envs):
                started(envs)
                return super().reify(envs)

        return AnnouncingLogsSpecs(
            log_dir=args.log_dir,
            redirects=self.Std.from_str(args.redirects),
            tee=self.Std.from_str(args.tee),
        )


def tune(config, grace_seconds: float) -> None:
    """The grace period, where this torch has it."""
    if hasattr(config, "shutdown_timeout"):  # newer torch; older ones wait a fixed 30 s
        config.shutdown_timeout = int(-(-grace_seconds // 1))  # whole seconds, rounded up


@contextmanager
def torch_takes_no_signals() -> Iterator[None]:
    """While the run lasts, torch's agent installs no signal handler: the launcher's stay."""
    from torch.distributed.elastic.multiprocessing import api

    if getattr(api, "signal", None) is not signal:  # missing() names it
        yield
        return
    api.signal = _NoHandlers()  # type: ignore[assignment]  # torch's module, while the run lasts
    try:
        yield
    finally:
        api.signal = signal


class _NoHandlers:
    """The signal module, for torch's multiprocessing module: setting a handler sets none."""

    def __getattr__(self, name: str):
        return getattr(signal, name)

    def signal(self, signum: int, handler):
        return signal.getsignal(signum)


@contextmanager
def tails_in_pieces(limit: int) -> Iterator[None]:
    """While it lasts, torch's tailer copies each rank's file in reads of at most `limit`
    characters (a line longer than that reaches the console in pieces)."""
    from torch.distributed.elastic.multiprocessing import tail_log

    original = tail_log.tail_logfile
    tail_log.tail_logfile = lambda *args, **named: _tail_in_pieces(limit, *args, **named)
    try:
        yield
    finally:
        tail_log.tail_logfile = original


def _tail_in_pieces(
    limit: int,
    header: str,
    file: str,
    dst,
    finished: threading.Event,
    interval_sec: float,
    log_line_filter: Callable[[str], bool] | None = None,
):
    """What torch's tail_logfile does (wait for the file, copy it to `dst` behind `header` until
    `finished` is set and its end is reached), reading at most `limit` characters at a time.
    `finished` is looked at before each read: a rank whose last lines land between a read that
    found the end and that look still has them copied (torch 2.15's order; 2.14's loses them)."""
    while True:
        was_finished = finished.is_set()
        if os.path.exists(file):
            break
        if was_finished:
            return
        time.sleep(interval_sec)
    with open(file, errors="replace") as stream:
        while True:
            was_finished = finished.is_set()
            piece = stream.readline(limit)
            if piece:
                if log_line_filter is None or log_line_filter(piece):
                    dst.write(header + piece)
            elif was_finished:
                return
            else:
                time.sleep(interval_sec)


FAILURE_LOGGER = "torch.distributed.elastic.multiprocessing.api"


@contextmanager
def failures_logged(failed: Callable[[int, int], None]) -> Iterator[None]:
    """For the run: `failed(exit code, local rank)` for each failure torch's agent logs as ending
    an attempt; a record worded otherwise is passed over."""

    def seen(record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        numbers = [arg for arg in args[:2] if isinstance(arg, int)]
        if str(record.msg).startswith("failed (exitcode") and len(numbers) == 2:
            failed(*numbers)
        return True  # the record goes on as it would

    logger = logging.getLogger(FAILURE_LOGGER)
    logger.addFilter(seen)
    try:
        yield
    finally:
        logger.removeFilter(seen)


def serve_store(own: str, port: int, descriptor: int | None):
    """A rendezvous store served on the listening socket `descriptor` (bound to `port`), or with
    None torch's libuv store listening on `port` itself (every interface); its own client
    connects to `own`. torch's rendezvous on this port then finds this store."""
    import torch
    from torch.distributed import TCPStore

    server = dict(wait_for_workers=False, multi_tenant=True)
    if descriptor is None:
        return TCPStore(own, port, None, True, STORE_TIMEOUT, use_libuv=True, **server)
    return TCPStore(
        own,
        port,
        None,
        True,
        STORE_TIMEOUT,
        master_listen_fd=descriptor,
        use_libuv=libuv_takes_a_listening_socket(torch.__version__),
        **server,
    )


def connect_store(address: str, port: int, seconds: float):
    """A client of machine 0's store at address:port, waiting at most `seconds` for it, that has
    had an answer from it: torch 2.4's client connects without a handshake, so another program
    that accepts the connection would only be found out at the client's first call."""
    from torch.distributed import TCPStore

    store = TCPStore(
        address, port, None, False, datetime.timedelta(seconds=seconds), wait_for_workers=False
    )
    store.check([ANSWERS])  # raises RuntimeError when nothing answers as a store within `seconds`
    return store


@dataclass
class RankStops:
    grace_seconds: float
    # The ranks of the latest attempt still running when it was stopped: local rank -> exit code.
    stopped: dict[int, int] = field(default_factory=dict)
    followed: bool = False  # False: this torch has no close() to follow; nothing is known
    attempt: object = None  # the latest attempt's process context


@contextmanager
def graceful_stops(grace_seconds: float, launcher=None) -> Iterator[RankStops]:
    """For the run: torch's agent stops ranks with the grace period and, with `launcher` (its
    death_signal(default), safe_point(), defer_while_starting), the stop's own signal; a death
    signal of 0: the ranks have the stop from SLURM already, so close() only waits the grace
    period, then kills what is left."""
    from torch.distributed.elastic.multiprocessing import api

    stops = RankStops(grace_seconds)
    PContext: Any = getattr(api, "PContext", None)  # this torch's class, if it has one
    if not _takes_a_timeout(PContext):  # missing() names it
        yield stops
        return
    original_close, original_wait = PContext.close, PContext.wait

    def close(context, death_sig=None, timeout=30):
        if context is not stops.attempt:
            stops.attempt, stops.stopped = context, {}
        if launcher is not None:
            chosen = launcher.death_signal(death_sig)
            death_sig = signal.Signals(chosen) if chosen else chosen  # 0: SLURM's, None: torch's
        running = _running(context)
        if death_sig == 0:
            _wait(running.values(), grace_seconds)
            death_sig, timeout = signal.SIGKILL, 0  # for the ranks still running: the end
        else:
            timeout = grace_seconds
        original_close(context, death_sig=death_sig, timeout=timeout)
        stops.stopped.update({rank: process.wait() for rank, process in running.items()})
        _close_rank_files(context)
        if launcher is not None:
            launcher.safe_point()

    def wait(context, *args, **kwargs):
        if launcher is not None:
            launcher.safe_point()
        return original_wait(context, *args, **kwargs)

    PContext.close, PContext.wait = close, wait
    stops.followed = True
    if launcher is not None:
        launcher.defer_while_starting = True  # wait() ends the start: a stop waits for it
    try:
        yield stops
    finally:
        PContext.close, PContext.wait = original_close, original_wait
        if launcher is not None:
            launcher.defer_while_starting = False


def _takes_a_timeout(context_class) -> bool:
    close: Any = getattr(context_class, "close", None)
    try:
        return {"death_sig", "timeout"} <= set(inspect.signature(close).parameters)
    except (TypeError, ValueError):
        return False


def _wait(processes, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return


def _close_rank_files(context) -> None:
    """The files torch's handlers opened for the ranks' output, closed (again, for those it
    closed itself); the ranks have their own descriptors."""
    for handler in (getattr(context, "subprocess_handlers", None) or {}).values():
        for name in ("_stdout", "_stderr"):
            stream = getattr(handler, name, None)
            if stream is not None:
                stream.close()


def _running(context) -> dict:
    """The context's ranks that have not exited (script ranks: Popen handlers), by local rank."""
    handlers = getattr(context, "subprocess_handlers", None) or {}
    return {rank: handler.proc for rank, handler in handlers.items() if handler.proc.poll() is None}
