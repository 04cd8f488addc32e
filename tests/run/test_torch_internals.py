"""The torch internals the several-process path relies on, checked against the installed torch.

Each release-dependent choice in run/torch_internals.py is tested on the torch that is installed
(tests/compat runs these tests on the oldest, a middle and the newest release); a branch that
does not apply to this torch is skipped, saying why, or taken with a described torch.
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

import torch
from torch.distributed import TCPStore
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, api, start_processes

from helpers import file_line
from mpslaunch.run.torch_internals import (bound_store, graceful_stops,
                                           libuv_takes_a_listening_socket, missing, release,
                                           serve_store, torch_takes_no_signals)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

TORCH = torch.__version__
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


@pytest.mark.parametrize("version, known, libuv", [
    ("2.4.1", (2, 4, 1), False),
    ("2.7.1+cu126", (2, 7, 1), False),
    ("2.8.0", (2, 8, 0), True),
    ("2.14.1+cu130", (2, 14, 1), True),
    ("2.8.0a0+git1234", None, False),  # a build from before the release may lack the fix
    ("2.9.0.dev20250801", None, False),
])
def test_the_libuv_store_is_chosen_from_the_release_that_takes_a_listening_socket(version, known, libuv):
    assert release(version) == known
    assert libuv_takes_a_listening_socket(version) is libuv


def listening_socket() -> tuple[int, int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener.getsockname()[1], listener.detach()


def test_the_store_served_on_this_torch_takes_the_launchers_socket():
    port, descriptor = listening_socket()
    store = serve_store("127.0.0.1", port, descriptor)
    store.set("key", "served")
    client = TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=10))
    assert client.get("key") == b"served"
    assert store.libuvBackend is libuv_takes_a_listening_socket(TORCH)


def test_this_torchs_libuv_store_takes_a_listening_socket_as_the_rule_says():
    """The fact behind the rule, on the installed release: before 2.8 the libuv store refuses."""
    port, descriptor = listening_socket()
    if libuv_takes_a_listening_socket(TORCH):
        store = TCPStore("127.0.0.1", port, None, True, master_listen_fd=descriptor, use_libuv=True)
        assert store.libuvBackend
    else:
        with pytest.raises(NotImplementedError, match="listen fd"):
            TCPStore("127.0.0.1", port, None, True, master_listen_fd=descriptor, use_libuv=True)
        socket.close(descriptor)


def test_nothing_the_launcher_relies_on_is_missing_from_this_torch():
    assert missing() == []


# ---------------------------------------------------------------- real process contexts

# Each rank writes <folder>/ready.<local rank>, then: "sleep" waits, "stubborn" ignores SIGTERM
# and waits, "exit" ends at once.
RANK = """
import os, signal, sys, time
rank, kind = os.environ["LOCAL_RANK"], sys.argv[2]
if kind == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(sys.argv[1], "ready." + rank), "w").write("ready\\n")
if kind != "exit":
    time.sleep(60)
"""


@contextmanager
def kept_handlers():
    """torch's contexts may set handlers in this process: the test's own come back after."""
    saved = {signum: signal.getsignal(signum) for signum in STOPPING}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def start_ranks(folder: Path, *kinds: str):
    """A real torch process context running one Python rank per kind, as torch's agent starts them."""
    envs = {rank: {"LOCAL_RANK": str(rank), "RANK": str(rank), "TORCHELASTIC_RUN_ID": "internals",
                   "TORCHELASTIC_RESTART_COUNT": "0"} for rank in range(len(kinds))}
    args = {rank: ("-c", RANK, str(folder), kind) for rank, kind in enumerate(kinds)}
    logs = DefaultLogsSpecs(log_dir=str(folder / "logs"))
    context = start_processes("internals", sys.executable, args, envs, logs)
    for rank in range(len(kinds)):
        file_line(folder / f"ready.{rank}", seconds=60)
    return context


@pytest.mark.slow
def test_the_close_swap_records_how_each_stopped_rank_ended(tmp_path):
    """Still running at the stop: rank 0 stops on SIGTERM, rank 1 ignores it and is killed when
    the grace period ends; rank 2 had ended by itself, so it was not stopped."""
    with kept_handlers(), torch_takes_no_signals():
        context = start_ranks(tmp_path, "sleep", "stubborn", "exit")
        context.subprocess_handlers[2].proc.wait(timeout=30)
        with graceful_stops(0.5) as stops:
            context.close()
    assert stops.followed
    assert stops.stopped == {0: -signal.SIGTERM, 1: -signal.SIGKILL}


def test_a_close_without_the_expected_parameters_is_left_alone_and_named(monkeypatch):
    """A torch whose PContext.close takes no timeout (described): no swap, and missing() says
    what the launcher cannot keep; the launcher prints it as a note."""
    def close(self, death_sig=None):
        pass

    monkeypatch.setattr(api.PContext, "close", close)
    with graceful_stops(0.5) as stops:
        assert api.PContext.close is close
    assert not stops.followed
    assert any("--grace_period" in line for line in missing())


class Launcher:
    """What graceful_stops asks of the launcher (run/torchrun/signals.py), recorded."""

    def __init__(self, stop: int = 0):
        self.stop, self.safe_points, self.defer_while_starting = stop, 0, False

    def death_signal(self, default):
        return self.stop or default

    def safe_point(self):
        self.safe_points += 1


@pytest.mark.slow
def test_the_swaps_send_the_stops_own_signal_and_tell_the_safe_points(tmp_path):
    """torch's agent looking at its ranks (wait) and the end of a close are where the launcher may
    unwind it; a close sends the signal that stopped the run, not torch's SIGTERM."""
    launcher = Launcher(stop=signal.SIGINT)
    with kept_handlers(), torch_takes_no_signals():
        context = start_ranks(tmp_path, "sleep")
        with graceful_stops(5, launcher) as stops:
            assert launcher.defer_while_starting
            assert context.wait(0) is None  # still running
            assert launcher.safe_points == 1
            context.close()
        assert not launcher.defer_while_starting
    assert launcher.safe_points == 2
    assert stops.stopped == {0: -signal.SIGINT}


@pytest.mark.slow
def test_torch_sets_no_handler_while_the_launcher_runs_it(tmp_path):
    """torch's own PContext.start, on this release: an ignored SIGHUP stays ignored, SIGTERM and
    SIGINT keep the launcher's, and the module is torch's own again after the run."""
    def launchers(signum, frame):
        pass

    with kept_handlers():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, launchers)
        signal.signal(signal.SIGINT, launchers)
        with torch_takes_no_signals():
            context = start_ranks(tmp_path, "exit")
        assert api.signal is signal
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is launchers
        assert signal.getsignal(signal.SIGINT) is launchers
        context.close()


@pytest.mark.slow
def test_without_the_swap_this_torch_takes_the_signals_over(tmp_path):
    """The control: what torch's PContext.start does on its own, which the swap above prevents."""
    with kept_handlers():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        context = start_ranks(tmp_path, "exit")
        assert signal.getsignal(signal.SIGTERM) is api._terminate_process_handler
        context.close()


@pytest.mark.slow
def test_from_another_thread_torch_sets_no_handler(tmp_path):
    """mpslaunch.launch() from a thread: torch 2.4 raises ValueError there."""
    errors = []

    def from_thread():
        try:
            with torch_takes_no_signals():
                start_ranks(tmp_path, "exit").close()
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    with kept_handlers():
        before = {signum: signal.getsignal(signum) for signum in STOPPING}
        worker = threading.Thread(target=from_thread)
        worker.start()
        worker.join()
        assert errors == []
        assert {signum: signal.getsignal(signum) for signum in STOPPING} == before


# Serves a store for argv[1] as argv[2] says ("plain": torch's store without libuv, "launcher":
# as the launcher serves it), connects a client from that same address, and says "served".
NAMELESS_PEER = """
import datetime, sys
from torch.distributed import TCPStore
address, how = sys.argv[1], sys.argv[2]
if how == "plain":
    store = TCPStore(address, 0, None, True, datetime.timedelta(seconds=10), use_libuv=False)
    port = store.port
else:
    from mpslaunch.run.torchrun.store import store_on
    served = store_on(address, 0)
    port, store = served.__enter__()
client = TCPStore(address, port, None, False, datetime.timedelta(seconds=10))
client.set("key", "value")
print("served", client.get("key").decode())
"""


@pytest.fixture
def host_without_names():
    """A network namespace whose address 10.201.7.1 has no name (its /etc/hosts names only
    localhost) and whose DNS cannot be reached, as on a cluster node without reverse DNS."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a network namespace needs root and iproute2's `ip netns`")
    name = f"mpsl-names-{os.getpid()}"
    folder = Path(f"/etc/netns/{name}")
    try:
        for args in (["netns", "add", name], ["-n", name, "link", "set", "lo", "up"],
                     ["-n", name, "addr", "add", "10.201.7.1/32", "dev", "lo"]):
            subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text("127.0.0.1 localhost\n")
        yield name
    except subprocess.CalledProcessError as error:
        pytest.skip(f"network namespaces are not available here: {error.stderr}")
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["plain", "launcher"])
def test_a_connection_from_an_address_without_a_name_aborts_torch_2_5s_store_only(
        host_without_names, how):
    """The fact behind bound_store, on the installed torch: torch 2.5's store without libuv
    aborts (SIGABRT, "failed to format addr") at such a connection; the store as the launcher
    serves it never does, on any release."""
    done = subprocess.run(["ip", "netns", "exec", host_without_names, sys.executable, "-c",
                           NAMELESS_PEER, "10.201.7.1", how], capture_output=True, text=True,
                          timeout=120)
    aborts = how == "plain" and not bound_store(TORCH, "10.201.7.1")
    if aborts:
        assert done.returncode == -signal.SIGABRT and "failed to format addr" in done.stderr
    else:
        assert done.returncode == 0 and done.stdout == "served value\n", done.stderr[-2000:]
