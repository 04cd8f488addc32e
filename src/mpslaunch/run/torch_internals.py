"""What the several-process path takes from torch beyond its public API, in one place, so that
what a new torch release may break is seen at a glance. Checked against torch 2.14.1; the other
torch releases mpslaunch supports are checked by the tests in tests/compat.

- torch.distributed.run's own parsing (parse_args, config_from_args) turns the command line the
  plan makes into elastic_launch's LaunchConfig (`Elastic.config`);
- LaunchConfig's shutdown_timeout and signals_to_handle (newer torch only), its
  log_line_prefix_template and logs_specs are set after parsing (`Elastic.config`, `tune`);
- DefaultLogsSpecs.reify is called with each attempt's rank environments (`Elastic.logs_specs`);
- PContext.close is swapped for the run (`graceful_stops`);
- TCPStore takes a listening socket (master_listen_fd), and with multi_tenant the store the
  launcher serves is the one torch's static rendezvous finds on that port (`serve_store`);
- ChildFailedError (get_first_failure, failures) and SignalException (sigval) end a run.

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
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

STORE_TIMEOUT = datetime.timedelta(seconds=900)  # torchrun's default rendezvous timeout


class Elastic:
    """The torch names this path uses, imported together (and only here)."""

    def __init__(self):
        import torch.distributed.run as run
        from torch.distributed.elastic.multiprocessing.api import (DefaultLogsSpecs, SignalException,
                                                                    Std)
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import elastic_launch

        self.run, self.launch = run, elastic_launch
        self.ChildFailedError, self.SignalException = ChildFailedError, SignalException
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
        class AnnouncingLogsSpecs(self.DefaultLogsSpecs):
            def reify(self, envs):
                started(envs)
                return super().reify(envs)

        return AnnouncingLogsSpecs(log_dir=args.log_dir, redirects=self.Std.from_str(args.redirects),
                                   tee=self.Std.from_str(args.tee))


def tune(config, grace_seconds: float, signals_to_handle: str) -> None:
    """The grace period and the signals torch's agent takes over, where this torch has them."""
    if hasattr(config, "shutdown_timeout"):  # newer torch; older ones wait a fixed 30 s
        config.shutdown_timeout = int(-(-grace_seconds // 1))  # whole seconds, rounded up
    if hasattr(config, "signals_to_handle"):  # newer torch; older ones take over all four
        config.signals_to_handle = signals_to_handle


def serve_store(own: str, port: int, descriptor: int):
    """A rendezvous store served on the listening socket `descriptor` (bound to `port`); its own
    client connects to `own`. torch's rendezvous on this port then finds this store."""
    from torch.distributed import TCPStore

    return TCPStore(own, port, None, True, STORE_TIMEOUT, wait_for_workers=False,
                    multi_tenant=True, master_listen_fd=descriptor)


def connect_store(address: str, port: int, seconds: float):
    """A client of machine 0's store at address:port, waiting at most `seconds` for it."""
    from torch.distributed import TCPStore

    return TCPStore(address, port, None, False, datetime.timedelta(seconds=seconds),
                    wait_for_workers=False)


@dataclass
class RankStops:
    grace_seconds: float
    stopped_pids: set[int] = field(default_factory=set)  # ranks still running at a close()
    followed: bool = False  # False: this torch has no close() to follow; nothing is known


@contextmanager
def graceful_stops(grace_seconds: float) -> Iterator[RankStops]:
    stops = RankStops(grace_seconds)
    try:
        from torch.distributed.elastic.multiprocessing.api import PContext
    except ImportError:
        yield stops
        return
    original = PContext.close

    def close(context, death_sig=None, timeout=30):
        stops.stopped_pids |= _running(context)
        original(context, death_sig=death_sig, timeout=grace_seconds)

    PContext.close = close
    stops.followed = True
    try:
        yield stops
    finally:
        PContext.close = original


def _running(context) -> set[int]:
    """The pids of the context's ranks that have not exited (script ranks: Popen handlers)."""
    handlers = getattr(context, "subprocess_handlers", None) or {}
    return {handler.proc.pid for handler in handlers.values() if handler.proc.poll() is None}
