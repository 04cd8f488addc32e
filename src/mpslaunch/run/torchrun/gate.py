"""Several machines: each launcher waits here until every machine has joined, then torch meets.

torch waits for the other machines inside C++ (TCPStore), where Ctrl-C and SIGTERM cannot reach
it, for 15 minutes, and without saying who is missing; a machine 0 that cannot be reached shows
as a C++ stack trace on every retry. So each launcher first checks in with machine 0's store
(key mpslaunch/joined/<machine rank>) and waits: the store calls run in a thread of their own
while the main thread waits in Python, so a stopping signal ends the wait at once
(signals.Stopped), even when a call never returns (another program on machine 0's port accepts
the connection and never answers the store's handshake); --rdzv_timeout bounds it (exit 1), and
either way one line names the machines that had not joined, or what answered on the port.
Machines 1 and up first wait for machine 0's port with a plain socket, one line per try. A
launcher for a machine rank that another launcher of the run holds
is refused in one line (exit 2). Each machine also leaves what its plan says must agree (device,
precision, processes per machine, machines: `agreed_terms`) and, while it waits, compares
every machine's with machine 0's: a difference is refused in one line on every machine (exit 2)
before any rank starts. torch's own rendezvous then finds every machine there.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from mpslaunch.machine import endpoint
from mpslaunch.output import MpslaunchError
from mpslaunch.run.processes import new_run_id
from mpslaunch.run.torch_internals import connect_store
from mpslaunch.run.torchrun.signals import Stopped

JOINED = "mpslaunch/joined/"
PLANNED = "mpslaunch/plan/"  # each machine's agreed_terms, as JSON
COMPARED = "mpslaunch/compared/"  # machine 0 serves the store until every machine has compared
COMPARE_SECONDS = 10.0
POLL_SECONDS = 0.2
NOTE_AFTER = (5.0, 30.0)  # the first "still waiting" line, then one this often (seconds)
# Past --rdzv_timeout, a store call that has not returned is taken as never returning (the thread
# making it gives up by itself within about a second of the timeout otherwise).
ANSWER_SECONDS = 1.5
CHECK_THE_PORT = (
    "machine 0's launcher serves the rendezvous on --main_process_port: check the "
    "port, another program may be using it"
)


class NotJoined(MpslaunchError):
    """--rdzv_timeout ran out before every machine had joined."""

    exit_code = 1


class Gate:
    """One wait for the machines of a run, from machine `rank`'s side."""

    def __init__(
        self,
        rank: int,
        machines: int,
        address: str,
        port: int,
        timeout: float,
        say: Callable[[str], None],
        terms: dict[str, str] | None = None,
    ):
        self.terms = terms or {}
        self.rank, self.machines, self.where = rank, machines, endpoint(address, port)
        self.address, self.port = address, port
        self.timeout, self.say = timeout, say
        self.started = time.monotonic()
        self.stage = "reaching"  # machine 0's port, then "handshake" with its store, "joined"
        self.missing = [other for other in range(machines) if other != rank]  # not joined yet
        self.stderr = _NativeStderr()
        self.done = threading.Event()
        self.failure: BaseException | None = None

    def wait(self, store=None) -> None:
        """Check in and wait for the others; `store`: machine 0's own, None to connect to it."""
        try:  # a stop that comes while the thread starts (it may say its first line by then) too
            threading.Thread(
                target=self._meet, args=(store,), name="mpslaunch-gate", daemon=True
            ).start()
            while not self.done.wait(POLL_SECONDS):  # the main thread stays free for signals
                if self._left() < -ANSWER_SECONDS:
                    raise NotJoined(self._unanswered())
        except Stopped as stop:
            raise Stopped(
                stop.signum,
                f"mpslaunch: stopped by {stop} while waiting for the "
                f"other machines: {self._who()} (exit code "
                f"{128 + stop.signum})",
            ) from None
        finally:
            self.stderr.close()  # a call left behind neither says nor drops anything from now on
        if self.failure is not None:
            raise self.failure

    def _meet(self, store) -> None:
        """The gate's thread: connect, check in, wait for every machine."""
        try:
            if store is None:
                store = self._connect()
            self.stage = "joined"  # the store answered: from now on, who is missing
            self._check_in(store)
            self._wait_for_all(store)
        except _Abandoned:
            pass
        except RuntimeError as error:  # torch's store errors: machine 0 went away meanwhile
            self.failure = NotJoined(
                f"lost machine 0's store at {self.where} while waiting "
                f"({type(error).__name__}); check that machine 0 still runs"
            )
        except BaseException as error:  # noqa: BLE001 (handed to the main thread, which raises it)
            self.failure = error
        finally:
            self.done.set()

    def _check_in(self, store) -> None:
        """Take this machine's rank, unless another launcher of the run already has it (it
        would otherwise wait, silently, for a place in a rendezvous that is full)."""
        me = f"{socket.gethostname()}, pid {os.getpid()}, {new_run_id()[:6]}"
        with self.stderr.dropped():
            holder = store.compare_set(f"{JOINED}{self.rank}", "", me).decode("utf-8", "replace")
        if holder != me:
            raise MpslaunchError(
                f"machine rank {self.rank} is taken: another launcher ({holder.rpartition(', ')[0]}) "
                f"joined {self.where} as machine {self.rank}; give each machine its own "
                f"--machine_rank, from 0 to {self.machines - 1}"
            )
        with self.stderr.dropped():
            store.set(f"{PLANNED}{self.rank}", json.dumps(self.terms))

    def _plans(self, store) -> dict[int, dict[str, str]]:
        """The plans the machines that have joined so far left, by machine rank."""
        with self.stderr.dropped():
            return {
                rank: json.loads(store.get(f"{PLANNED}{rank}"))
                for rank in range(self.machines)
                if store.check([f"{PLANNED}{rank}"])
            }

    def _refuse(self, store, problem: str, plans: dict[int, dict[str, str]]) -> None:
        """Say `problem` on this machine; machine 0, whose store the others read, waits (briefly)
        until every machine that left a plan has compared it too."""
        with self.stderr.dropped():
            store.set(f"{COMPARED}{self.rank}", "1")
        deadline = time.monotonic() + COMPARE_SECONDS
        while self.rank == 0 and time.monotonic() < deadline:
            with self.stderr.dropped():
                if all(store.check([f"{COMPARED}{rank}"]) for rank in plans):
                    break
            time.sleep(POLL_SECONDS)
        raise MpslaunchError(problem)

    def _connect(self):
        pause = 1.0
        while True:
            problem = _reachable(self.address, self.port, min(pause, self._left()))
            if problem is None:
                self.stage = "handshake"
                try:
                    return connect_store(self.address, self.port, max(self._left(), 1.0))
                except RuntimeError as error:  # it closed the connection: not a store, or not yet
                    problem = (
                        f"its port answers, but not as a rendezvous store: {type(error).__name__}"
                    )
            self._give_up_if_late()
            self._say(
                f"mpslaunch: machine 0 at {self.where} cannot be reached yet ({problem}); "
                f"trying again in {pause:g} s ({self._elapsed()} of --rdzv_timeout "
                f"{self.timeout:g} s)"
            )
            time.sleep(max(min(pause, self._left()), 0))
            pause = min(pause * 2, NOTE_AFTER[1])

    def _wait_for_all(self, store) -> None:
        next_note = self.started + NOTE_AFTER[0]
        while True:
            with self.stderr.dropped():
                self.missing = [
                    rank for rank in range(self.machines) if not store.check([f"{JOINED}{rank}"])
                ]
            plans = self._plans(store)
            problem = plan_difference(plans)
            if problem:
                self._refuse(store, problem, plans)
            if not self.missing and len(plans) == self.machines:
                return
            self._give_up_if_late()
            if time.monotonic() >= next_note:
                self._say(
                    f"mpslaunch: waiting for {_machines(self.missing)} to join at "
                    f"{self.where} ({self._elapsed()} of --rdzv_timeout {self.timeout:g} s)"
                )
                next_note = time.monotonic() + NOTE_AFTER[1]
            time.sleep(POLL_SECONDS)

    def _say(self, text: str) -> None:
        if self.stderr.closed:
            raise _Abandoned
        self.say(text)

    def _who(self) -> str:
        if self.stage == "reaching":
            return f"machine 0 at {self.where} could not be reached"
        if self.stage == "handshake":
            return f"machine 0 at {self.where} did not answer as a rendezvous store"
        return f"{_machines(self.missing)} had not joined at {self.where}"

    def _unanswered(self) -> str:
        """Why the gate's thread is still in a store call past --rdzv_timeout."""
        if self.stage == "handshake":
            return (
                f"something answers at {self.where}, but not as a rendezvous store (no answer "
                f"to the store's handshake within --rdzv_timeout {self.timeout:g} s); "
                + CHECK_THE_PORT
            )
        return (
            f"machine 0's store at {self.where} stopped answering (--rdzv_timeout "
            f"{self.timeout:g} s); check that machine 0 still runs"
        )

    def _give_up_if_late(self) -> None:
        if self._left() <= 0:
            raise NotJoined(
                f"{self._who()} after {self.timeout:g} s (--rdzv_timeout); start "
                "every machine with the same --main_process_ip and "
                "--main_process_port, or give them longer with --rdzv_timeout"
            )

    def _left(self) -> float:
        return self.started + self.timeout - time.monotonic()

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self.started:.0f} s"


def agreed_terms(
    device: str, mixed_precision: str, processes: int, machines: int
) -> dict[str, str]:
    """What every machine of a run must plan alike (docs/several-machines.md)."""
    return {
        "device": device,
        "mixed precision": mixed_precision,
        "processes per machine": str(processes),
        "machines": str(machines),
    }


def plan_difference(plans: dict[int, dict[str, str]]) -> str | None:
    """The first way a machine's plan differs from machine 0's, as a one-line refusal."""
    main = plans.get(0)
    if not main:
        return None
    for rank, plan in sorted(plans.items()):
        for term, value in main.items():
            if plan.get(term) != value:
                return (
                    f"the machines' plans differ: machine {rank} plans {term} {plan.get(term)}, "
                    f"machine 0 plans {value}; give every machine the same device, "
                    "--mixed_precision, --num_processes and --num_machines"
                )
    return None


class _Abandoned(Exception):
    """The main thread stopped waiting: the gate's thread ends quietly."""


class _NativeStderr:
    """Descriptor 2, sent to /dev/null while a store call runs: when machine 0 goes away, torch's
    C++ writes a warning with a 20-line stack there before raising; the error is said in one line
    instead. Only the launcher writes at this point (no rank has started). `close()` (the main
    thread, done waiting) gives it back at once, even while a call it left behind still runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.saved: int | None = None  # the real descriptor 2, while dropped
        self.closed = False

    @contextmanager
    def dropped(self) -> Iterator[None]:
        with self.lock:
            if self.closed:
                raise _Abandoned
            sys.stderr.flush()
            self.saved = os.dup(2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        try:
            yield
        finally:
            self._give_back()

    def close(self) -> None:
        with self.lock:
            self.closed = True
        self._give_back()

    def _give_back(self) -> None:
        with self.lock:
            if self.saved is not None:
                os.dup2(self.saved, 2)
                os.close(self.saved)
                self.saved = None


def _machines(ranks: list[int]) -> str:
    return f"machine{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _reachable(address: str, port: int, seconds: float) -> str | None:
    """Why address:port does not accept a connection now, or None when it does."""
    try:
        with socket.create_connection((address, port), timeout=max(seconds, 0.1)):
            return None
    except TimeoutError:
        return "no answer"
    except OSError as error:
        return (error.strerror or str(error)).lower()
