"""Run the several-process path on each torch release mpslaunch claims, one environment at a time.

For each release: a fresh virtual environment with that torch and its torchvision, the Accelerate
pip chooses and this repository installed editable with its test extras; the hand checks
(hand_checks.py) and the tests (TESTS, or those --test names) in it; then the environment is
removed (torch's Linux wheels pull several GB of CUDA libraries). Prints a Markdown table of the results.
Linux only (the tests and the hand checks read /proc). The tests and the hand checks start with
the stopping signals at their defaults, so a run under nohup or as a `&` job checks the same;
each failing test is kept with the first line of what it said.

    python tests/compat/run_releases.py                    # the oldest, 2.5, 2.8 and the newest here
    python tests/compat/run_releases.py 2.4.1/0.19.1       # torch/torchvision pairs of your own
    python tests/compat/run_releases.py --no-pip-config 2.15.0/0.29.2  # past a machine's pip cap
    python tests/compat/run_releases.py --test tests/run/torchrun/test_stops.py 2.5.1/0.20.1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RELEASES = ["2.4.1/0.19.1", "2.5.1/0.20.1", "2.8.0/0.23.0", "2.14.1/0.29.1"]  # torch/torchvision
TESTS = ["tests/run", "tests/launcher/test_api.py", "tests/commands/test_selftest.py",
         "tests/machine/test_mps_verdict.py"]
TEST_SECONDS = 1800
COLUMNS = ["torch", "accelerate", "env", "run + API tests", "all-reduce", "failing rank",
           "SIGTERM", "test 2 processes", "nohup (HUP)", "background (INT)"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("releases", nargs="*", default=RELEASES, metavar="TORCH/TORCHVISION")
    parser.add_argument("--envs", default=tempfile.gettempdir(),
                        help="folder for the environments, each removed after use")
    parser.add_argument("--python", default=sys.executable, help="the Python to build them from")
    parser.add_argument("--no-pip-config", action="store_true",
                        help="install without pip's configuration files (PIP_CONFIG_FILE="
                             "/dev/null): for a release newer than a machine-wide pip "
                             "constraint allows")
    parser.add_argument("--test", action="append", dest="tests", metavar="PATH",
                        help="a test file or folder to run, once each (default: "
                             f"{' '.join(TESTS)})")
    args = parser.parse_args(argv)
    pip_env = {**os.environ, "PIP_CONFIG_FILE": os.devnull} if args.no_pip_config else None
    rows = []
    for release in args.releases:
        torch_version, _, vision_version = release.partition("/")
        rows.append(one_release(Path(args.envs), args.python, torch_version, vision_version,
                                pip_env, args.tests or TESTS))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    given = sys.argv[1:] if argv is None else argv
    print(f"`python tests/compat/run_releases.py {' '.join(given)}`, "
          f"{datetime.date.today().isoformat()}, {os.uname().sysname} {os.uname().machine}, "
          f"Python {python_version(args.python)}\n")
    print(table(rows))
    return 0 if all(passed(row) for row in rows) else 1


def one_release(envs: Path, python: str, torch_version: str, vision_version: str,
                pip_env: dict[str, str] | None = None, tests: list[str] = TESTS) -> dict:
    env = envs / f"mpslaunch-torch-{torch_version}"
    shutil.rmtree(env, ignore_errors=True)
    row = {"torch": torch_version}
    started = time.monotonic()
    try:
        problem = build(env, python, torch_version, vision_version, pip_env)
        row["env"] = (f"{time.monotonic() - started:.0f} s, {disk_gb(env):.1f} GB" if not problem
                      else f"FAIL: {problem}")
        if problem:
            return row
        env_python = str(env / "bin" / "python")
        row["accelerate"] = installed(env_python, "accelerate")
        row.update(hand_checks(env_python))
        row["run + API tests"] = run_tests(env_python, tests)
    finally:
        shutil.rmtree(env, ignore_errors=True)
    return row


def build(env: Path, python: str, torch_version: str, vision_version: str,
          pip_env: dict[str, str] | None = None) -> str | None:
    """`pip_env`: the environment pip installs in (None: this one's)."""
    subprocess.run([python, "-m", "venv", str(env)], check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as pins:
        pins.write(f"torch=={torch_version}\ntorchvision=={vision_version}\n")
        pins.flush()
        done = subprocess.run([str(env / "bin" / "pip"), "install", "-q", "-c", pins.name, "torch",
                               "torchvision", "-e", f"{REPO}[test]"], capture_output=True,
                              text=True, env=pip_env)
    if done.returncode != 0:
        return last_line(done.stderr)
    found = installed(str(env / "bin" / "python"), "torch")
    return None if found == torch_version else f"pip installed torch {found}"


def installed(python: str, package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}).split('+')[0])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


# Signals a shell's `&` (SIGINT, SIGQUIT) or nohup (SIGHUP) leaves ignored are inherited by
# every child: the tests that send them to a launch would see them ignored and fail falsely.
STOPPING = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM")


def default_signals() -> None:
    """In the child, before the tests or the hand checks start: each stopping signal as a
    process started from a terminal gets it."""
    for name in STOPPING:
        signal.signal(getattr(signal, name), signal.SIG_DFL)


def hand_checks(python: str) -> dict:
    done = subprocess.run([python, str(HERE / "hand_checks.py")], capture_output=True, text=True,
                          cwd=REPO, timeout=1800, preexec_fn=default_signals)
    try:
        results = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"all-reduce": f"FAIL: the hand checks did not run: {last_line(done.stderr)}"}
    results.pop("torch", None)
    return {name: value if value == "ok" else f"FAIL: {value}" for name, value in results.items()}


def run_tests(python: str, tests: list[str] = TESTS) -> str:
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "junit.xml"
        try:
            done = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   f"--junitxml={report}", *tests], capture_output=True, text=True,
                                  cwd=REPO, timeout=TEST_SECONDS, preexec_fn=default_signals)
        except subprocess.TimeoutExpired:
            return f"FAIL: more than {TEST_SECONDS} s"
        failed = failures(report)
    counts = re.findall(r"(\d+ (?:passed|failed|skipped|errors?))", last_line(done.stdout))
    text = ", ".join(counts) or last_line(done.stdout)
    return text if done.returncode == 0 else f"FAIL: {text}: {'; '.join(failed)}"


def failures(report: Path) -> list[str]:
    """Each failed or erred test of a JUnit XML report, with the first line of what it said."""
    import xml.etree.ElementTree as ElementTree

    try:
        cases = ElementTree.parse(report).getroot().iter("testcase")
    except (OSError, ElementTree.ParseError):
        return ["no test report (pytest did not finish)"]
    found = []
    for case in cases:
        for outcome in (*case.iter("failure"), *case.iter("error")):
            said = (outcome.get("message") or outcome.text or "").strip().splitlines()
            found.append(f"{case.get('classname')}::{case.get('name')} ({said[0][:200] if said else ''})")
    return found


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(column, "")) for column in COLUMNS) + " |")
    return "\n".join(lines)


def passed(row: dict) -> bool:
    return all(not str(value).startswith("FAIL") for value in row.values())


def disk_gb(folder: Path) -> float:
    total = sum(path.lstat().st_size for path in folder.rglob("*") if not path.is_symlink())
    return total / 1e9


def python_version(python: str) -> str:
    return subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True).stdout.strip()


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:300] if lines else ""


if __name__ == "__main__":
    sys.exit(main())
