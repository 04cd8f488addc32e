"""mpslaunch.launch: the same plan from Python, for a script or a function, one process or several."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

import mpslaunch
from helpers import REPO, one_line_error, own_lines, run_cli, write_script
from mpslaunch.output import MpslaunchError


@pytest.mark.slow
def test_import_mpslaunch_stays_cheap():
    code = ("import sys, mpslaunch; print('torch' in sys.modules, 'mpslaunch.launcher.api' in sys.modules); "
            "mpslaunch.launch; print('torch' in sys.modules, 'mpslaunch.launcher.api' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["False False", "False True"]


@pytest.mark.slow
def test_a_script_runs_as_the_cli_runs_it(tmp_path, capfd):
    script = write_script(tmp_path, "report.py", """
import json, os, sys
print(json.dumps([sys.argv[1:], os.environ["ACCELERATE_USE_CPU"], os.environ["ACCELERATE_MIXED_PRECISION"]]))
sys.exit(3)
""")
    assert mpslaunch.launch(str(script), "--lr", 0.5, cpu=True, mixed_precision="bf16", quiet=True) == 3
    out, err = capfd.readouterr()
    assert json.loads(out) == [["--lr", "0.5"], "true", "bf16"] and err == ""


def seen_by_the_function(key: str, value: int):
    return os.environ.get(key), value * 2


def test_a_function_runs_here_with_the_plan_for_the_call(capfd):
    assert "ACCELERATE_MIXED_PRECISION" not in os.environ
    assert mpslaunch.launch(seen_by_the_function, "ACCELERATE_MIXED_PRECISION", 21, cpu=True,
                            mixed_precision="bf16") == ("bf16", 42)
    assert "ACCELERATE_MIXED_PRECISION" not in os.environ  # restored after the call
    assert "mpslaunch: cpu: asked for by cpu=True; precision bf16; 1 process" in capfd.readouterr().err
    results = []
    worker = threading.Thread(target=lambda: results.append(
        mpslaunch.launch(seen_by_the_function, "MPSLAUNCH_DEVICE", 1, cpu=True, quiet=True)))
    worker.start()
    worker.join()
    assert results == [("cpu", 2)]


@pytest.mark.parametrize("call, words", [
    (lambda: mpslaunch.launch(seen_by_the_function, num_proc=2), "did you mean num_processes?"),
    (lambda: mpslaunch.launch(lambda: 1, cpu=True, num_processes=2, start_method="spawn"),
     "cannot be sent to the processes"),
    (lambda: mpslaunch.launch(seen_by_the_function, cpu=True, num_processes=2, start_method="posix"),
     "start_method must be fork, spawn or forkserver"),
])
def test_mistakes_are_one_line(call, words):
    with pytest.raises(MpslaunchError) as caught:
        call()
    assert words in str(caught.value) and "\n" not in str(caught.value)


class PathOfBytes:
    def __fspath__(self):
        return b"train.py"


@pytest.mark.parametrize("target, args, named, words", [
    (b"train.py", (), {}, "runs a script (its path, as text) or a function, not bytes b'train.py'; "
     "decode it with os.fsdecode()"),
    (PathOfBytes(), (), {}, "not bytes b'train.py'"),
    (None, (), {}, "runs a script (its path, as text) or a function, not None"),
    (3, (), {}, "not int 3"),
    ("train.py", ("--tag", "a\0b"), {}, "argument 2 holds a NUL character, which no command line "
     "can carry: 'a\\x00b'"),
    ("tr\0ain.py", (), {}, "the script's path holds a NUL character"),
    ("train.py", (), {"profile": 3}, "profile= must be text, not int 3"),
    ("train.py", (), {"config_file": ["a.yaml"]}, "config_file= must be text, not list"),
    ("train.py", (), {"start_method": "posix"}, "start_method must be fork, spawn or forkserver"),
])
def test_wrong_targets_and_arguments_are_one_line_before_anything_is_printed(
        tmp_path, monkeypatch, capfd, target, args, named, words):
    monkeypatch.chdir(tmp_path)
    write_script(tmp_path, "train.py", "raise SystemExit('must not run')\n")
    with pytest.raises(MpslaunchError) as caught:
        mpslaunch.launch(target, *args, cpu=True, **named)
    assert words in str(caught.value) and "\n" not in str(caught.value)
    assert capfd.readouterr() == ("", "")


def test_several_processes_of_a_script_from_a_thread_are_refused_before_the_plan_line(
        tmp_path, capfd):
    script = write_script(tmp_path, "train.py", "raise SystemExit('must not run')\n")
    caught = []

    def from_a_thread():
        try:
            mpslaunch.launch(str(script), cpu=True, num_processes=2)
        except MpslaunchError as error:
            caught.append(str(error))

    worker = threading.Thread(target=from_a_thread)
    worker.start()
    worker.join()
    assert len(caught) == 1 and "started from the main thread only" in caught[0]
    assert capfd.readouterr() == ("", "")  # no plan line, nothing started


NOTEBOOK = """
import json, threading, mpslaunch

def train(tag):  # defined in __main__ without a file, as in a notebook cell
    from accelerate import Accelerator
    accelerator = Accelerator()
    result = [accelerator.process_index, accelerator.num_processes, accelerator.device.type,
              accelerator.mixed_precision, tag]
    accelerator.end_training()
    return result

print("RESULT", json.dumps(mpslaunch.launch(train, "here", cpu=True, mixed_precision="bf16", quiet=True)))
print("RESULT", json.dumps(mpslaunch.launch(train, "ranks", cpu=True, num_processes=2, quiet=True)))
box = []
thread = threading.Thread(target=lambda: box.append(mpslaunch.launch(train, "thread", cpu=True,
                                                                     num_processes=2, quiet=True)))
thread.start()
thread.join()
print("RESULT", json.dumps(box[0]))
"""


@pytest.mark.slow
def test_a_notebook_function_in_one_process_then_several_then_from_a_thread():
    done = subprocess.run([sys.executable, "-c", NOTEBOOK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    here, ranks, from_thread = [json.loads(line.removeprefix("RESULT "))
                                for line in own_lines(done.stdout, "RESULT ")]
    assert here == [0, 1, "cpu", "bf16", "here"]
    # A fresh Accelerate state in each rank: nothing inherited from the call above.
    assert ranks == {"0": [0, 2, "cpu", "no", "ranks"], "1": [1, 2, "cpu", "no", "ranks"]}
    assert from_thread == {"0": [0, 2, "cpu", "no", "thread"], "1": [1, 2, "cpu", "no", "thread"]}


@pytest.mark.slow
def test_the_cli_from_a_thread_runs_one_process_and_refuses_several_in_one_line(tmp_path):
    script = write_script(tmp_path, "hello.py", "print('ran')")
    code = f"""
import threading
from mpslaunch.commands import main
codes = []
for extra in ([], ["--num_processes", "2"]):
    thread = threading.Thread(target=lambda: codes.append(main(["launch", "--cpu", "-q", *extra, {str(script)!r}])))
    thread.start()
    thread.join()
print(codes)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["ran", "[0, 2]"]
    assert done.stderr.count("\n") == 1 and "started from the main thread only" in done.stderr


@pytest.mark.slow
def test_the_notebook_example_runs_as_a_script():
    example = REPO / "examples" / "notebook_launch.py"
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    one, several = own_lines(done.stdout, "(0, ", "{0: ")  # the example's own two lines
    assert one.startswith("(0, ") and several.startswith("{0: (0, 'cpu', ") and ", 1: (1, 'cpu', " in several


@pytest.mark.slow
@pytest.mark.parametrize("option, value, word", [
    ("grace_period", -5, "-5"),
    ("num_processes", 0, "0"),
    ("tee", "9", "9"),
    ("monitor_interval", 0.0, "0"),
    ("device", "gpu", "gpu"),
    ("gpu_ids", "0, 1", "0, 1"),
])
def test_the_api_refuses_what_the_cli_refuses_in_the_same_words(tmp_path, option, value, word):
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    with pytest.raises(MpslaunchError) as caught:
        mpslaunch.launch(str(script), cpu=True, **{option: value})
    cli = one_line_error(run_cli("launch", "--cpu", f"--{option}", word, str(script)))
    assert cli.startswith(f"mpslaunch: error: {caught.value} (see `mpslaunch launch --help`)")
    assert str(caught.value).startswith(f"--{option} ")
    assert not (tmp_path / "train.py.ran").exists()


def test_a_refusal_names_the_keyword_as_it_was_given(tmp_path):
    """A setting given to mpslaunch.launch() is named as its keyword, not as a flag."""
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    with pytest.raises(MpslaunchError, match=r"^mixed_precision='fp16' asks for fp16, but fp16 "):
        mpslaunch.launch(str(script), cpu=True, mixed_precision="fp16")
    with pytest.raises(MpslaunchError, match=r"^cpu=True and device='mps' contradict each other"):
        mpslaunch.launch(str(script), cpu=True, device="mps")
    assert not (tmp_path / "train.py.ran").exists()


def precision_seen(until: threading.Event):
    """The plan's precision at the start, and again once `until` is set or 3 s have passed:
    another thread's launch in between must not change what this call sees."""
    first = os.environ.get("ACCELERATE_MIXED_PRECISION")
    until.wait(3)
    for _ in range(100):  # a leak shows within a second
        if os.environ.get("ACCELERATE_MIXED_PRECISION") != first:
            break
        threading.Event().wait(0.01)
    return first, os.environ.get("ACCELERATE_MIXED_PRECISION")


def test_two_threads_each_get_their_own_plan_and_leave_the_environment_as_it_was():
    before = dict(os.environ)
    second_called, first_returned, results = threading.Event(), threading.Event(), {}

    def first():
        results["bf16"] = mpslaunch.launch(precision_seen, second_called, cpu=True,
                                           mixed_precision="bf16", quiet=True)
        first_returned.set()

    def second():
        second_called.set()
        results["no"] = mpslaunch.launch(precision_seen, first_returned, cpu=True,
                                         mixed_precision="no", quiet=True)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    while "ACCELERATE_MIXED_PRECISION" not in os.environ and threads[0].is_alive():
        threading.Event().wait(0.01)  # the first call is inside its function
    threads[1].start()
    for thread in threads:
        thread.join()
    assert results == {"bf16": ("bf16", "bf16"), "no": ("no", "no")}
    assert dict(os.environ) == before


@pytest.mark.slow
def test_several_processes_leave_the_callers_environment_as_it_was():
    before = dict(os.environ)
    assert mpslaunch.launch(seen_by_the_function, "MPSLAUNCH_DEVICE", 1, cpu=True,
                            num_processes=2, quiet=True) == {0: ("cpu", 2), 1: ("cpu", 2)}
    assert dict(os.environ) == before


FAILING_FUNCTION = """
import mpslaunch

def train_step(batch):
    raise ValueError(f"bad batch {batch}")

if __name__ == "__main__":
    for start_method in ("fork", "spawn"):
        try:
            mpslaunch.launch(train_step, 7, cpu=True, num_processes=2, quiet=True,
                             start_method=start_method)
        except Exception as error:
            print("raised:", type(error).__name__, str(error).splitlines()[1:3], flush=True)
"""


@pytest.mark.slow
def test_a_failing_function_is_named_by_its_own_name(tmp_path):
    write_script(tmp_path, "failing.py", FAILING_FUNCTION)
    done = subprocess.run([sys.executable, "failing.py"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=240)
    raised = [line for line in done.stdout.splitlines() if line.startswith("raised:")]
    assert len(raised) == 2 and all("train_step FAILED" in line for line in raised), done.stdout
    assert "bad batch 7" in done.stderr
    assert "fresh_call" not in done.stdout + done.stderr, done.stderr[-3000:]


KEEPS_HANDLERS = """
import os, signal, time
import mpslaunch

NAMES = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGALRM")

def handlers():
    return {name: signal.getsignal(getattr(signal, name)) for name in NAMES}

def answers():
    return 1

def fails():
    raise ValueError("no")

def interrupts():  # rank 0 presses Ctrl-C for the caller (its parent: the ranks are forked)
    if os.environ["RANK"] == "0":
        os.kill(os.getppid(), signal.SIGINT)
    time.sleep(60)

signal.signal(signal.SIGHUP, lambda signum, frame: None)  # one of the caller's own
before = handlers()
for function in (answers, fails, interrupts):
    try:
        mpslaunch.launch(function, cpu=True, num_processes=2, quiet=True)
        print(function.__name__, "returned", flush=True)
    except Exception as error:
        print(function.__name__, "raised", type(error).__name__, flush=True)
    except KeyboardInterrupt:
        print(function.__name__, "interrupted", flush=True)
    print("handlers as they were:", handlers() == before, "wakeup fd:", signal.set_wakeup_fd(-1), flush=True)
try:
    try:
        signal.raise_signal(signal.SIGINT)  # a later Ctrl-C
    except Exception as error:
        print("a later Ctrl-C was swallowed as", type(error).__name__, flush=True)
except KeyboardInterrupt:
    print("a later Ctrl-C raised KeyboardInterrupt", flush=True)
"""


@pytest.mark.slow
def test_several_processes_leave_the_callers_signal_handlers_as_they_were(tmp_path):
    """After success, after a failure, and after a Ctrl-C during the run (which reaches the caller
    as its own handler has it: KeyboardInterrupt), the caller's handlers are back as they were
    (torch's agent takes none), and a later Ctrl-C is the caller's again."""
    write_script(tmp_path, "caller.py", KEEPS_HANDLERS)
    done = subprocess.run([sys.executable, "caller.py"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "answers returned", "handlers as they were: True wakeup fd: -1",
        "fails raised ChildFailedError", "handlers as they were: True wakeup fd: -1",
        "interrupts interrupted", "handlers as they were: True wakeup fd: -1",
        "a later Ctrl-C raised KeyboardInterrupt"], done.stderr[-3000:]
