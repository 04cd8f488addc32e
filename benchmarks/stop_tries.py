"""Stops at random moments, counted: how often a stop ends a run as docs/cli.md (Signals) says.
The tests place each stop at a chosen stage; this throws them at whatever the launcher is doing.

- restarts: 2 processes, `--max_restarts 1000`, ranks that fail at once; SIGTERM or SIGINT
  (alternately) a random 1 to 8 s after the plan line. Right: exit 143 / 130, nothing left.
- bursts: SIGINT, SIGHUP and SIGTERM at once, a random 0 to 3 s after the plan line of a
  2-process run of ranks that sleep (--grace_period 600). Right: exit 128 + N for the N the last
  line names, no rank named as failed, no traceback, the launcher gone within 60 s, nothing left.
- service: machine 1 of 2 whose --main_process_port is served by Python's HTTP server,
  --rdzv_timeout 5: seconds from the start to the one-line error, and from a SIGINT (sent once
  the store's connection is open) to the exit.

    .venv/bin/python benchmarks/stop_tries.py --tries 12 --bursts 40
"""

from __future__ import annotations

import argparse
import http.server
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

LAUNCH = [sys.executable, "-m", "mpslaunch", "launch", "--cpu", "--num_processes", "2"]
FAILS = "import sys; sys.exit(3)\n"
SLEEPS = "import time; time.sleep(120)\n"


def marked(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def start(args: list[str], marker: str) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "STOP_TRIES_MARKER": marker})


def ended(launcher: subprocess.Popen, seconds: float) -> str | None:
    """Its stderr once it ended, or None (then it is killed) when it did not within `seconds`."""
    try:
        return launcher.communicate(timeout=seconds)[1]
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.communicate()
        return None


def left_over(marker: str) -> int:
    time.sleep(1)
    pids = marked(marker)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return len(pids)


def restarts(folder: Path, tries: int) -> None:
    script = folder / "fails.py"
    script.write_text(FAILS)
    right = 0
    for number in range(tries):
        signum = (signal.SIGTERM, signal.SIGINT)[number % 2]
        marker = f"run-{uuid.uuid4().hex}"
        launcher = start([*LAUNCH, "--max_restarts", "1000", str(script)], marker)
        launcher.stderr.readline()  # the plan line
        time.sleep(random.uniform(1, 8))
        launcher.send_signal(signum)
        stderr = ended(launcher, 60)
        restarted = stderr.count("starting every rank again") if stderr else -1
        ok = stderr is not None and launcher.returncode == 128 + signum and not left_over(marker)
        right += ok
        print(f"restarts: {signal.Signals(signum).name} after {restarted} restarts: "
              f"exit {launcher.returncode}{'' if ok else '  <- wrong'}", flush=True)
    print(f"restarts: stopped as it should in {right} of {tries} tries", flush=True)


def bursts(folder: Path, tries: int) -> None:
    script = folder / "sleeps.py"
    script.write_text(SLEEPS)
    right = 0
    for _ in range(tries):
        marker = f"run-{uuid.uuid4().hex}"
        launcher = start([*LAUNCH, "--grace_period", "600", str(script)], marker)
        launcher.stderr.readline()  # the plan line
        time.sleep(random.uniform(0, 3))
        for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            launcher.send_signal(signum)
        stderr = ended(launcher, 60)
        ours = [line for line in (stderr or "").splitlines() if line.startswith("mpslaunch: ")]
        named = re.match(r"mpslaunch: stopped by (SIG[A-Z]+)", ours[-2] if len(ours) > 1 else "")
        ok = (stderr is not None and named is not None
              and launcher.returncode == 128 + getattr(signal, named[1])
              and "failed first" not in stderr and "Traceback" not in stderr)
        ok = left_over(marker) == 0 and ok
        right += ok
        if not ok:
            print(f"bursts: wrong: exit {launcher.returncode}: {(stderr or 'no end')[-600:]}", flush=True)
    print(f"bursts: stopped as they should in {right} of {tries} bursts", flush=True)


class _Silent(http.server.BaseHTTPRequestHandler):
    def setup(self):
        super().setup()
        self.server.connections.release()

    def log_message(self, *args):
        pass


def service(folder: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Silent)
    server.connections = threading.Semaphore(0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script = folder / "never.py"
    script.write_text("raise SystemExit('must not run')\n")
    machine_1 = [*LAUNCH[:5], "-q", "--num_machines", "2", "--machine_rank", "1",
                 "--main_process_ip", "127.0.0.1", "--main_process_port",
                 str(server.server_address[1]), str(script)]
    for timeout, stop in (("5", None), ("900", signal.SIGINT)):
        server.connections = threading.Semaphore(0)
        started = time.monotonic()
        launcher = start([*machine_1[:-1], "--rdzv_timeout", timeout, str(script)], "service")
        for _ in range(2):  # the launcher's probe of the port, then the store's connection
            server.connections.acquire(timeout=120)
        connected = time.monotonic()
        if stop:
            launcher.send_signal(stop)
        stderr = ended(launcher, 120)
        print(f"service: --rdzv_timeout {timeout}{', SIGINT' if stop else ''}: exit "
              f"{launcher.returncode}, {time.monotonic() - started:.1f} s from the start, "
              f"{time.monotonic() - connected:.2f} s from the store's connection: "
              f"{(stderr or 'no end').strip().splitlines()[-1]}", flush=True)
    server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=12, help="stops during restarts")
    parser.add_argument("--bursts", type=int, default=40, help="bursts at start-up")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        service(Path(folder))
        restarts(Path(folder), args.tries)
        bursts(Path(folder), args.bursts)


if __name__ == "__main__":
    main()
