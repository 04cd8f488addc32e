"""tests/compat/run_releases.py's own parts: the children it starts get the stopping signals at
their defaults whatever it was started with (nohup, a shell's `&`), and a failing test is kept
with the first line of what it said."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_releases  # noqa: E402

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="the script runs on Linux only"),
              pytest.mark.slow]

# Started as nohup and a non-interactive shell's `&` leave it: SIGHUP, SIGINT, SIGQUIT ignored.
AS_A_BACKGROUND_JOB = """
import signal, subprocess, sys
sys.path.insert(0, sys.argv[1])
import run_releases
for name in ("SIGHUP", "SIGINT", "SIGQUIT"):
    signal.signal(getattr(signal, name), signal.SIG_IGN)
shown = "import signal; print([signal.getsignal(getattr(signal, n)) != signal.SIG_IGN for n in ('SIGHUP', 'SIGINT', 'SIGQUIT', 'SIGTERM')])"
print(subprocess.run([sys.executable, "-c", shown], capture_output=True, text=True,
                     preexec_fn=run_releases.default_signals).stdout.strip())
"""


def test_the_tests_start_with_the_stopping_signals_at_their_defaults():
    done = subprocess.run([sys.executable, "-c", AS_A_BACKGROUND_JOB, str(Path(run_releases.__file__).parent)],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[True, True, True, True]", done.stderr
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN  # this process is untouched


def test_a_failing_test_is_kept_with_the_first_line_it_said(tmp_path):
    tests = tmp_path / "test_sample.py"
    tests.write_text("def test_passes():\n    pass\n\n"
                     "def test_fails():\n    assert 1 == 2, 'the first line\\nand a second'\n")
    said = run_releases.run_tests(sys.executable, [str(tests)])
    assert said.startswith("FAIL: 1 failed, 1 passed: ")
    assert said.endswith("test_sample::test_fails (AssertionError: the first line)"), said
