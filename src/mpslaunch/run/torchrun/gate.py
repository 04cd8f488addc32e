"""Several machines: each launcher waits here until every machine has joined, then torch meets.

torch waits for the other machines inside C++ (TCPStore), where Ctrl-C and SIGTERM cannot reach
it, for 15 minutes, and without saying who is missing; a machine 0 that cannot be reached shows
as a C++ stack trace on every retry. So each launcher first checks in with machine 0's store
(key mpslaunch/joined/<machine rank>) and waits in Python: a stopping signal ends the wait at
once (signals.Stopped), --rdzv_timeout bounds it (exit 1), and either way one line names the
machines that had not joined. Machines 1 and up first wait for machine 0's port with a plain
socket, one line per try. A launcher for a machine rank that another launcher of the run holds
is refused in one line (exit 2). torch's own rendezvous then finds every machine there.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from mpslaunch.output import MpslaunchError
from mpslaunch.machine import endpoint
from mpslaunch.run.processes import new_run_id
from mpslaunch.run.torch_internals import connect_store
from mpslaunch.run.torchrun.signals import Stopped

JOINED = "mpslaunch/joined/"
POLL_SECONDS = 0.2
NOTE_AFTER = (5.0, 30.0)  # the first "still waiting" line, then one this often (seconds)


class NotJoined(MpslaunchError):
    """--rdzv_timeout ran out before every machine had joined."""

    exit_code = 1


class Gate:
    """One wait for the machines of a run, from machine `rank`'s side."""

    def __init__(self, rank: int, machines: int, address: str, port: int, timeout: float,
                 say: Callable[[str], None]):
        self.rank, self.machines, self.where = rank, machines, endpoint(address, port)
        self.address, self.port = address, port
        self.timeout, self.say = timeout, say
        self.started = time.monotonic()
        self.missing: list[int] | None = None  # None: machine 0 not reached yet

    def wait(self, store=None) -> None:
        """Check in and wait for the others; `store`: machine 0's own, None to connect to it."""
        try:
            store = store or self._connect()
            self._check_in(store)
            self._wait_for_all(store)
        except Stopped as stop:
            raise Stopped(stop.signum, f"mpslaunch: stopped by {stop} while waiting for the "
                                       f"other machines: {self._who()} (exit code "
                                       f"{128 + stop.signum})") from None
        except RuntimeError as error:  # torch's store errors: machine 0 went away meanwhile
            raise NotJoined(f"lost machine 0's store at {self.where} while waiting "
                            f"({type(error).__name__}); check that machine 0 still runs") from None

    def _check_in(self, store) -> None:
        """Take this machine's rank, unless another launcher of the run already has it (it
        would otherwise wait, silently, for a place in a rendezvous that is full)."""
        me = f"{socket.gethostname()}, pid {os.getpid()}, {new_run_id()[:6]}"
        with _native_stderr_dropped():
            holder = store.compare_set(f"{JOINED}{self.rank}", "", me).decode("utf-8", "replace")
        if holder != me:
            raise MpslaunchError(
                f"machine rank {self.rank} is taken: another launcher ({holder.rpartition(', ')[0]}) "
                f"joined {self.where} as machine {self.rank}; give each machine its own "
                f"--machine_rank, from 0 to {self.machines - 1}")

    def _connect(self):
        pause = 1.0
        while True:
            problem = _reachable(self.address, self.port, min(pause, self._left()))
            if problem is None:
                return connect_store(self.address, self.port, max(self._left(), 1.0))
            self._give_up_if_late()
            self.say(f"mpslaunch: machine 0 at {self.where} cannot be reached yet ({problem}); "
                     f"trying again in {pause:g} s ({self._elapsed()} of --rdzv_timeout "
                     f"{self.timeout:g} s)")
            time.sleep(min(pause, self._left()))
            pause = min(pause * 2, NOTE_AFTER[1])

    def _wait_for_all(self, store) -> None:
        next_note = self.started + NOTE_AFTER[0]
        while True:
            with _native_stderr_dropped():
                self.missing = [rank for rank in range(self.machines)
                                if not store.check([f"{JOINED}{rank}"])]
            if not self.missing:
                return
            self._give_up_if_late()
            if time.monotonic() >= next_note:
                self.say(f"mpslaunch: waiting for {_machines(self.missing)} to join at "
                         f"{self.where} ({self._elapsed()} of --rdzv_timeout {self.timeout:g} s)")
                next_note = time.monotonic() + NOTE_AFTER[1]
            time.sleep(POLL_SECONDS)

    def _who(self) -> str:
        if self.missing is None:
            return f"machine 0 at {self.where} could not be reached"
        return f"{_machines(self.missing)} had not joined at {self.where}"

    def _give_up_if_late(self) -> None:
        if self._left() <= 0:
            raise NotJoined(f"{self._who()} after {self.timeout:g} s (--rdzv_timeout); start "
                            "every machine with the same --main_process_ip and "
                            "--main_process_port, or give them longer with --rdzv_timeout")

    def _left(self) -> float:
        return self.started + self.timeout - time.monotonic()

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started:.0f} s"


@contextmanager
def _native_stderr_dropped() -> Iterator[None]:
    """While a store call runs: when machine 0 goes away, torch's C++ writes a warning with a
    20-line stack to descriptor 2 before raising; the error is said in one line instead. Only
    the launcher writes at this point (no rank has started)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _machines(ranks: list[int]) -> str:
    return f"machine{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _reachable(address: str, port: int, seconds: float) -> str | None:
    """Why address:port does not accept a connection now, or None when it does."""
    try:
        with socket.create_connection((address, port), timeout=max(seconds, 0.1)):
            return None
    except socket.timeout:
        return "no answer"
    except OSError as error:
        return (error.strerror or str(error)).lower()
