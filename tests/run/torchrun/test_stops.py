"""How a several-process run stops: the grace period when a rank fails, a second signal while the
first is handled, and what the summary says about each rank.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli, write_script
from mpslaunch.run.torchrun.outcome import RankFailure, failure_summary
from mpslaunch.run.torchrun.signals import LauncherSignals, Stopped
from test_rendezvous import free_port, machine, wait_until_machine_0_waits

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses Linux signals")

# Rank 0 takes `save seconds` to save when asked to stop (SIGTERM); rank 1 fails (exit 3) once
# rank 0 is ready.
SAVES_SLOWLY = """
import os, signal, sys, time
from pathlib import Path
folder, save_seconds = Path(sys.argv[1]), float(sys.argv[2])
if os.environ["RANK"] == "0":
    def save(signum, frame):
        (folder / "asked").write_text("")
        time.sleep(save_seconds)
        (folder / "saved").write_text("")
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, save)
    (folder / "ready.0").write_text("")
    while True:
        time.sleep(1)
while not (folder / "ready.0").exists():
    time.sleep(0.05)
sys.exit(3)
"""


@pytest.mark.parametrize("grace, save, saved", [
    (1, 20, False),  # torch's own 30 s would let it save
    (60, 31, True),  # torch's own 30 s would kill it mid-save
], ids=["grace-1s-save-20s", "grace-60s-save-31s"])
def test_when_a_rank_fails_the_others_get_the_grace_period_to_stop(tmp_path, grace, save, saved):
    script = write_script(tmp_path, "saves.py", SAVES_SLOWLY)
    result = run_cli("launch", "--cpu", "-q", "--num_processes", "2", "--grace_period", str(grace),
                     str(script), str(tmp_path), str(save), timeout=save + 90)
    assert result.returncode == 3, result.stderr
    assert (tmp_path / "asked").exists()
    assert (tmp_path / "saved").exists() == saved, result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    assert summary.startswith("mpslaunch: rank 1 failed first: it exited with code 3;"), summary
    if saved:
        assert summary.endswith("; rank 0 was stopped"), summary
    else:
        assert summary.endswith(f"; rank 0 did not stop within --grace_period {grace} s and was "
                                "killed (SIGKILL)"), summary


def test_a_rank_that_ended_by_itself_is_not_called_stopped():
    """Rank 0 was killed by SIGKILL on its own (the kernel's OOM killer, say) before the launcher
    stopped anyone: it failed; it was not stopped."""
    first = RankFailure(1, 1, 101, 3, None)
    by_itself = failure_summary(first, {0: -signal.SIGKILL}, stopped=set(), grace_seconds=30)
    assert by_itself.endswith("; rank 0 also failed: it was killed by SIGKILL (exit code 137)")
    told = failure_summary(first, {0: -signal.SIGTERM}, stopped={0}, grace_seconds=30)
    assert told.endswith("; rank 0 was stopped")
    killed = failure_summary(first, {0: -signal.SIGKILL}, stopped={0}, grace_seconds=2.5)
    assert killed.endswith("; rank 0 did not stop within --grace_period 2.5 s and was killed (SIGKILL)")


def test_a_second_stopping_signal_while_the_first_is_handled_raises_nothing():
    """GNU timeout sends SIGTERM twice: the second must not raise while the first unwinds (it
    came from inside the clean-up, as a traceback and exit 1)."""
    with LauncherSignals(30, run_id="no-such-run") as signals:
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises within the first bytecodes of the sleep
        os.kill(os.getpid(), signal.SIGTERM)  # now, during the first one's clean-up
        for _ in range(50):
            time.sleep(0.01)  # a raising handler would raise here
        signals.quiet()
    assert signals.watcher.time_up  # the second signal still hurried the kill of the ranks


def test_sigterms_in_a_burst_during_the_wait_for_the_other_machines_never_give_a_traceback(tmp_path):
    """GNU timeout sends SIGTERM twice; here SIGTERM comes again and again until the launcher
    is gone, so some land while the first one unwinds. It ends stopped by SIGTERM: 143, or
    killed by SIGTERM itself once its handlers are given back at the very end; never exit 1."""
    script = write_script(tmp_path, "never.py", "open(__file__ + '.ran', 'w')\n")
    for _ in range(2):
        port = free_port()
        launcher = subprocess.Popen([sys.executable, "-m", "mpslaunch", *machine(0, port, script)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until_machine_0_waits(port, launcher)
            while launcher.poll() is None:
                launcher.send_signal(signal.SIGTERM)
                time.sleep(0.001)
            _, stderr = launcher.communicate(timeout=60)
        finally:
            launcher.kill()
            launcher.communicate()
        assert launcher.returncode in (143, -signal.SIGTERM), stderr
        assert "Traceback" not in stderr
        assert stderr.strip().splitlines()[-1].startswith(
            "mpslaunch: stopped by SIGTERM while waiting for the other machines")
    assert not Path(f"{script}.ran").exists()
