"""Several machines, played by launchers on this computer over the loopback: the wait for the
other machines can be stopped and is bounded, and machine 0 serves only on its own address.

Nothing here sends traffic outside 127.0.0.1: the refused address is never connected to (the
check lists this machine's interfaces), and every launcher that waits, waits on the loopback.
"""

from __future__ import annotations

import datetime
import http.server
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from helpers import run_cli, write_script

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

NEVER_RUNS = "open(__file__ + '.ran', 'w')\n"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def machine(rank: int, port: int, script, *extra: str) -> list[str]:
    return ["launch", "--cpu", "-q", "--num_machines", "2", "--machine_rank", str(rank),
            "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), *extra, str(script)]


@pytest.fixture
def start():
    """Start a launcher; whatever is still running at the end of the test is killed (a launcher
    that ignores signals must not outlive a failing test)."""
    launchers = []

    def launch(args: list[str]) -> subprocess.Popen:
        launchers.append(subprocess.Popen([sys.executable, "-m", "mpslaunch", *args],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        return launchers[-1]

    yield launch
    for launcher in launchers:
        launcher.kill()
        launcher.communicate()


def wait_until_machine_0_waits(port: int, launcher: subprocess.Popen) -> None:
    """Machine 0 has checked in with its own store: it now waits for machine 1."""
    from torch.distributed import TCPStore

    deadline = time.monotonic() + 90
    while True:
        assert time.monotonic() < deadline and launcher.poll() is None, "machine 0 never served"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.1)
    store = TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=30),
                     wait_for_workers=False)
    while not store.check(["mpslaunch/joined/0"]):
        assert time.monotonic() < deadline and launcher.poll() is None, "machine 0 never waited"
        time.sleep(0.05)


def first_line(stream, seconds: float = 90) -> str:
    """The first line the launcher writes, read without waiting forever."""
    lines = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    return lines.get(timeout=seconds)


@pytest.mark.slow
def test_machine_0_waiting_for_machine_1_stops_on_sigterm_and_says_who_is_missing(tmp_path, start):
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    port = free_port()
    launcher = start(machine(0, port, script))
    wait_until_machine_0_waits(port, launcher)
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=30)  # before: the signal did nothing for 15 minutes
    assert launcher.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == (
        "mpslaunch: stopped by SIGTERM while waiting for the other machines: machine 1 had not "
        f"joined at 127.0.0.1:{port} (exit code 143)")
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_machine_1_waiting_for_machine_0_retries_in_one_line_and_stops_on_ctrl_c(tmp_path, start):
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    port = free_port()  # nobody listens there: machine 0 never comes
    launcher = start(machine(1, port, script))
    first = first_line(launcher.stderr)
    assert first.startswith(f"mpslaunch: machine 0 at 127.0.0.1:{port} cannot be reached yet "
                            "(connection refused); trying again in 1 s"), first
    launcher.send_signal(signal.SIGINT)
    _, rest = launcher.communicate(timeout=30)
    assert launcher.returncode == 130, rest
    lines = rest.strip().splitlines()
    assert all(line.startswith("mpslaunch: ") for line in lines), rest  # no C++ stack, no traceback
    assert lines[-1] == ("mpslaunch: stopped by SIGINT while waiting for the other machines: "
                         f"machine 0 at 127.0.0.1:{port} could not be reached (exit code 130)")


@pytest.mark.slow
def test_rdzv_timeout_ends_the_wait_with_exit_1_and_says_who_is_missing(tmp_path):
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    port = free_port()
    result = run_cli(*machine(0, port, script, "--rdzv_timeout", "2"), timeout=90)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"mpslaunch: error: machine 1 had not joined at 127.0.0.1:{port} after 2 s (--rdzv_timeout)")
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_machine_0_refuses_a_main_address_that_is_not_its_own(tmp_path):
    """The issue's case: a profile for machine 0 with someone else's address used to retry for
    15 minutes. 198.51.100.7 (TEST-NET-2) is no interface of this computer."""
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    args = ["launch", "--cpu", "--num_machines", "2", "--machine_rank", "0", "--main_process_ip",
            "198.51.100.7", str(script)]
    result = run_cli(*args, timeout=60)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("mpslaunch: error: --main_process_ip 198.51.100.7 is not an address of "
                           "this machine") and "--main_process_ip_via_nat" in line
    assert not (tmp_path / "never.py.ran").exists()
    # Through NAT the address is not its own, by design: then it is accepted (with gloo told its
    # interface: this computer's name may stand for the loopback, test_machines.py).
    assert run_cli(*args[:-1], "--main_process_ip_via_nat", "--dry-run", str(script),
                   env={"GLOO_SOCKET_IFNAME": "lo"}).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("machine_0, machine_1, difference", [
    (["--mixed_precision", "bf16"], ["--mixed_precision", "no"],
     "machine 1 plans mixed precision no, machine 0 plans bf16"),
    (["--num_processes", "2"], ["--num_processes", "1"],
     "machine 1 plans processes per machine 1, machine 0 plans 2"),
    ([], ["--num_machines", "3"], "machine 1 plans machines 3, machine 0 plans 2"),
])
def test_machines_with_different_plans_are_refused_on_every_machine(tmp_path, start, machine_0,
                                                                      machine_1, difference):
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    port = free_port()
    launchers = [start(machine(0, port, script, *machine_0)), start(machine(1, port, script, *machine_1))]
    for launcher in launchers:
        _, stderr = launcher.communicate(timeout=120)
        assert launcher.returncode == 2, stderr[-2000:]
        assert "Traceback" not in stderr, stderr[-2000:]
        assert stderr.strip().splitlines()[-1] == (  # after machine 1's "cannot be reached yet"
            f"mpslaunch: error: the machines' plans differ: {difference}; give every machine the "
            "same device, --mixed_precision, --num_processes and --num_machines")
    assert not (tmp_path / "never.py.ran").exists()


class SignalledAsItStarts(threading.Thread):
    """The gate's thread, with a SIGINT that comes before its start() has returned: on a loaded
    machine the thread may have said its first line by then."""

    def start(self):
        super().start()
        signal.raise_signal(signal.SIGINT)


def test_a_stop_as_the_wait_starts_is_said_as_a_stop_of_the_wait(monkeypatch):
    from mpslaunch.run.torchrun import gate
    from mpslaunch.run.torchrun.signals import Stopped

    def stop(signum, _frame):
        raise Stopped(signum)

    port = free_port()  # nobody listens there: machine 0 never comes
    waiting = gate.Gate(1, 2, "127.0.0.1", port, 30, lambda line: None)
    previous = signal.signal(signal.SIGINT, stop)
    monkeypatch.setattr(gate.threading, "Thread", SignalledAsItStarts)
    try:
        with pytest.raises(Stopped) as stopped:
            waiting.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped.value.summary == ("mpslaunch: stopped by SIGINT while waiting for the other "
                                     f"machines: machine 0 at 127.0.0.1:{port} could not be "
                                     "reached (exit code 130)")


def test_the_first_difference_from_machine_0_is_named():
    from mpslaunch.run.torchrun.gate import agreed_terms, plan_difference

    same = agreed_terms("cpu", "bf16", 2, 3)
    assert plan_difference({0: same, 1: same, 2: same}) is None
    assert plan_difference({1: agreed_terms("cuda", "bf16", 2, 3)}) is None  # machine 0 not yet
    assert "machine 2 plans device cuda, machine 0 plans cpu" in plan_difference(
        {2: agreed_terms("cuda", "bf16", 2, 3), 0: same, 1: same})


class _Silent(http.server.BaseHTTPRequestHandler):
    """An HTTP server's handler: it waits for a request line, which the store's handshake never
    sends, so the connection stays open and unanswered."""

    def setup(self):
        super().setup()
        self.server.connections.release()

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    """Another service on machine 0's address: Python's own HTTP server, on a free port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Silent)
    server.connections = threading.Semaphore(0)  # released once per connection accepted
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_machine_1_facing_another_service_on_the_port_fails_within_the_timeout(tmp_path, http_server):
    """The port answers, but not as a rendezvous store: one line naming the address once
    --rdzv_timeout has passed, exit 1, never a wait without end."""
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    port = http_server.server_address[1]
    result = run_cli(*machine(1, port, script, "--rdzv_timeout", "5"), timeout=60)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"mpslaunch: error: something answers at 127.0.0.1:{port}, but not as a rendezvous store "
        "(no answer to the store's handshake within --rdzv_timeout 5 s); machine 0's launcher "
        "serves the rendezvous on --main_process_port: check the port, another program may be "
        "using it")
    assert not (tmp_path / "never.py.ran").exists()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_machine_1_waiting_on_another_service_stops_on_a_signal(tmp_path, start, http_server, signum):
    """The store's handshake waits inside torch's C++; a stopping signal still ends it at once."""
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    port = http_server.server_address[1]
    launcher = start(machine(1, port, script, "--rdzv_timeout", "900"))
    for _ in range(2):  # the launcher's plain probe of the port, then the store's own connection
        assert http_server.connections.acquire(timeout=90), "the launcher never connected"
    launcher.send_signal(signum)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signum, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == (
        f"mpslaunch: stopped by {signal.Signals(signum).name} while waiting for the other "
        f"machines: machine 0 at 127.0.0.1:{port} did not answer as a rendezvous store "
        f"(exit code {128 + signum})")
