"""`mpslaunch config`: writing, --default, show, interruptions, and the CLI end to end.

The questionnaire runs here through prompt_toolkit pipe input and, once, in a real terminal
(tmux send-keys / capture-pane); those tests are skipped only when tmux is not installed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from mpslaunch.commands import config as configure
from mpslaunch.settings import profile_files
from helpers import MACHINES, run_cli, wait_for
from mpslaunch.machine import Machine, probe
from mpslaunch.settings import Profile

M2 = Machine(system="Darwin", arch="arm64", macos_version=(14, 5), chip="Apple M2",
             torch_version="2.14.1", cpu_count=8, python="/usr/bin/python3")
LINUX_CPU = Machine(system="Linux", arch="x86_64", torch_version="2.14.1", cpu_count=4,
                    python="/usr/bin/python3")
EXISTING = "# hand-edited, keep me\nversion: 1\ndevice: cpu\nnum_processes: 2\n"


def default_here() -> Profile:
    """What --default writes on the machine running the tests (the rule itself is tested on
    described machines below): one process per NVIDIA GPU, else one."""
    return configure.default_profile(probe(), os.environ)


def interactive(path: Path, machine: Machine, keys: str, close: bool = False) -> int:
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        if close:
            pipe.close()
        with create_app_session(input=pipe, output=DummyOutput()):
            return configure.interactive(path, machine)


# ---------------------------------------------------------------- interruptions write nothing


@pytest.mark.parametrize("keys, close, code", [("\r\x03", False, 130), ("\r", True, 2)],
                         ids=["ctrl-c", "end-of-input"])
def test_interrupted_questions_leave_the_existing_profile_byte_for_byte(tmp_path, capsys, keys, close, code):
    path = tmp_path / "default.yaml"
    path.write_text(EXISTING)
    before = path.read_bytes(), path.stat().st_mtime_ns
    assert interactive(path, LINUX_CPU, keys, close) == code
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["default.yaml"]  # no temp file left
    err = capsys.readouterr().err.strip()
    assert "nothing written" in err and str(path) in err and "\n" not in err


def test_interrupted_questions_create_no_file(tmp_path):
    path = tmp_path / "new.yaml"
    assert interactive(path, LINUX_CPU, "\x03") == 130
    assert not path.exists()


def test_answers_are_written_shown_and_loadable(tmp_path, capsys):
    path = tmp_path / "sub" / "fast.yaml"
    assert interactive(path, M2, "\r" "\x1b[B\r" "\r" "\r") == 0  # auto, fp16, fallback, no cap
    assert profile_files.load(path) == Profile(mixed_precision="fp16", num_processes=1)
    out = capsys.readouterr().out
    assert f"Wrote {path}" in out and "mixed_precision: fp16" in out
    assert "device auto -> mps: Apple M2, macOS 14.5, torch 2.14.1" in out


def test_the_existing_profile_gives_the_defaults(tmp_path):
    path = tmp_path / "default.yaml"
    path.write_text(EXISTING)
    assert interactive(path, LINUX_CPU, "\r\r\r\r") == 0  # cpu, 2 processes, one machine, no
    assert profile_files.load(path) == Profile(device="cpu", num_processes=2)


def test_a_broken_existing_profile_is_named_then_replaced(tmp_path, capsys):
    path = tmp_path / "default.yaml"
    path.write_text("devise: mps\n")
    assert interactive(path, LINUX_CPU, "\r\r\r\r") == 0
    assert "mpslaunch: warning: the existing profile cannot be used as a starting point" in capsys.readouterr().err
    assert profile_files.load(path) == Profile(num_processes=1)


# ---------------------------------------------------------------- --default and show


def test_default_on_apple_silicon_means_auto_which_is_mps(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(configure.machine_probe, "probe", lambda: M2)
    path = tmp_path / "default.yaml"
    args = argparse.Namespace(action=None, default=True, profile=None, config_file=str(path))
    assert configure.main(args) == 0
    written = profile_files.load(path)
    assert written == Profile() and written.device == "auto"
    assert "device auto -> mps: Apple M2" in capsys.readouterr().out


@pytest.mark.parametrize("machine, processes", [
    ("linux_8gpu", 8), ("linux_2gpu", 2), ("linux_1gpu", 1), ("m2_macos15", 1), ("linux_cpu", 1),
])
def test_default_leaves_the_process_count_to_each_machine(tmp_path, capsys, monkeypatch, machine, processes):
    """A home folder shared with a GPU machine: the profile written on either one means one
    process per GPU on each, and says what that is here."""
    monkeypatch.setattr(configure.machine_probe, "probe", lambda: MACHINES[machine])
    path = tmp_path / "default.yaml"
    args = argparse.Namespace(action=None, default=True, profile=None, config_file=str(path))
    assert configure.main(args) == 0
    assert profile_files.load(path) == Profile(device="auto", num_processes=None)
    assert "num_processes: null" in path.read_text()
    assert f"precision no; {processes} process" in capsys.readouterr().out
    assert configure.show(str(path), None, MACHINES["linux_8gpu"]).endswith("8 processes, one per "
                                                                           "GPU (--num_processes 1 for one)")
    assert configure.show(str(path), None, MACHINES["linux_cpu"]).endswith("precision no; 1 process")


def test_show_says_what_auto_becomes_and_what_would_be_refused(tmp_path):
    path = tmp_path / "p.yaml"
    profile_files.save(Profile(), path)
    text = configure.show(str(path), None, M2)
    assert text.startswith(f"# {path}\n") and "device: auto" in text
    assert text.endswith("on this machine: device auto -> mps: Apple M2, macOS 14.5, torch 2.14.1; "
                         "precision no; 1 process")
    profile_files.save(Profile(device="mps"), path)
    assert f"would refuse: device: mps in {path} asks for mps" in \
        configure.show(str(path), None, LINUX_CPU)


def test_show_marks_the_keys_the_file_leaves_to_their_defaults(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("device: cpu\nnum_machines: 1\n")
    lines = configure.show(str(path), None, LINUX_CPU).splitlines()
    assert "device: cpu" in lines and "num_machines: 1" in lines  # in the file, even at its default
    assert "mixed_precision: 'no'  # default" in lines and "machine_rank: 0  # default" in lines


# ---------------------------------------------------------------- end to end through the CLI


@pytest.mark.slow
def test_cli_without_a_terminal_asks_for_default_and_does_not_hang(tmp_path):
    started = time.monotonic()
    done = run_cli("config", config_dir=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "--default" in done.stderr
    assert time.monotonic() - started < 30
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_cli_default_writes_named_profiles_and_show_reads_them(tmp_path):
    done = run_cli("config", "--yes", "--profile", "fast", config_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert profile_files.load(tmp_path / "fast.yaml") == default_here()
    shown = run_cli("config", "show", "--profile", "fast", config_dir=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith(f"# {tmp_path / 'fast.yaml'}")
    assert "on this machine: device auto -> " in shown.stdout

    target = tmp_path / "elsewhere" / "mine.yaml"
    assert run_cli("config", "--default", "--config_file", str(target), config_dir=tmp_path).returncode == 0
    assert profile_files.load(target) == default_here()


@pytest.mark.slow
def test_cli_says_how_to_use_a_named_profile(tmp_path):
    done = run_cli("config", "--default", "--profile", "trial", config_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "use it with `mpslaunch launch --profile trial script.py`"


@pytest.mark.slow
def test_a_profile_written_off_a_mac_has_no_mps_keys_and_still_loads(tmp_path):
    done = run_cli("config", "--default", config_dir=tmp_path)  # this machine is no Mac
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "default.yaml").read_text()
    assert "device: auto" in written and "mps_" not in written
    assert profile_files.load(tmp_path / "default.yaml") == default_here()
    shown = run_cli("config", "show", config_dir=tmp_path)
    assert shown.returncode == 0 and "mps_" not in shown.stdout
    # A profile from a Mac, with the MPS keys, loads and shows here too.
    configure.write(Profile(mps_fallback=False), tmp_path / "mac.yaml", M2)
    assert "mps_fallback: false" in (tmp_path / "mac.yaml").read_text()
    shown = run_cli("config", "show", "--profile", "mac", config_dir=tmp_path)
    assert shown.returncode == 0 and "mps_fallback: false" in shown.stdout


@pytest.mark.slow
@pytest.mark.parametrize("spelling", [["--default"], ["default"]])
def test_cli_default_takes_accelerate_style_choices(tmp_path, spelling):
    done = run_cli("config", *spelling, "--mixed_precision", "bf16", "--num-processes", "2",
                   "--device", "cpu", config_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    written = profile_files.load(tmp_path / "default.yaml")
    assert written == Profile(device="cpu", mixed_precision="bf16", num_processes=2)
    assert "on this machine: device cpu -> cpu: asked for by the profile; precision bf16; 2 processes" in done.stdout


@pytest.mark.slow
def test_cli_show_without_a_profile_shows_the_defaults(tmp_path):
    done = run_cli("config", "show", config_dir=tmp_path)
    assert done.returncode == 0
    assert done.stdout.startswith(f"# no profile at {tmp_path / 'default.yaml'}")


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (("config", "show", "--profile", "missing"), "no profile at"),
    (("config", "show", "--default"), "give one of them"),
    (("config", "--default", "--profile", "a", "--config_file", "b.yaml"), "not both"),
    (("config", "--default", "--profile", "bad/name"), "plain name"),
    (("config", "--default", "--config_file", "."), "is a folder"),
    (("config", "--mixed_precision", "bf16"), "goes with `config --default`"),
    (("config", "show", "--device", "cpu"), "goes with `config --default`"),
    (("config", "default", "--mixed_precision", "fp16", "--device", "cpu"), "bf16 on cpu"),
    (("config", "--default", "--num_processes", "0"), "--num_processes must be 1 or more"),
])
def test_cli_mistakes_are_one_line_and_exit_2(tmp_path, args, words):
    done = run_cli(*args, config_dir=tmp_path)
    assert done.returncode == 2 and words in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


# ---------------------------------------------------------------- a real terminal


class Tmux:
    """One private tmux server (its own socket), killed at the end: nothing else is touched."""

    def __init__(self, command: str):
        self.socket = f"mpslaunch-test-{uuid.uuid4().hex[:8]}"
        self.tmux("new-session", "-d", "-s", "t", "-x", "120", "-y", "50", command)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              check=True, timeout=10).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        """The screen once it shows `text`."""
        screen = wait_for(lambda: self._showing(text), timeout)
        assert screen, f"{text!r} never appeared; the screen:\n{self.screen()}"
        return screen

    def _showing(self, text: str) -> str | None:
        screen = self.screen()
        return screen if text in screen else None

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def terminal(tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install -y tmux); the real-terminal test needs it")
    sessions = []

    def start(*args: str) -> Tmux:
        command = (f"env MPSLAUNCH_CONFIG_DIR={tmp_path} {sys.executable} -m mpslaunch config "
                   f"{' '.join(args)}; echo EXIT=$?; sleep 60")
        sessions.append(Tmux(command))
        return sessions[-1]

    yield start
    for session in sessions:
        session.close()


@pytest.mark.slow
def test_questions_in_a_real_terminal(terminal, tmp_path):
    screen = terminal()
    screen.wait_for("Which device should training use?")
    screen.keys("Up", "Enter")  # the list wraps round: cpu is always the last choice
    screen.wait_for("How many CPU processes")  # up to 4 per core: asked even on one core
    screen.keys("1", "Enter")
    screen.wait_for("several machines?")
    screen.keys("n")
    screen.wait_for("Mixed precision?")
    screen.keys("Down", "Enter")  # bf16
    text = screen.wait_for("EXIT=")
    assert "EXIT=0" in text and "fp16 not offered" in text
    assert profile_files.load(tmp_path / "default.yaml") == Profile(device="cpu", mixed_precision="bf16", num_processes=1)


@pytest.mark.slow
def test_a_wrong_answer_shows_right_under_its_question_in_a_real_terminal(terminal):
    screen = terminal()
    screen.wait_for("Which device should training use?")
    screen.keys("Up", "Enter")
    screen.wait_for("How many CPU processes")
    screen.keys("9999", "Enter")
    lines = screen.wait_for("give a number from 1 to").splitlines()
    asked = next(i for i, line in enumerate(lines) if "How many CPU processes" in line)
    assert "give a number from 1 to" in lines[asked + 1]


@pytest.mark.slow
def test_the_rendezvous_choices_say_what_they_mean_in_a_real_terminal(terminal):
    screen = terminal()
    screen.wait_for("Which device should training use?")
    screen.keys("Up", "Enter")
    screen.wait_for("How many CPU processes")
    screen.keys("Enter")
    screen.wait_for("several machines?")
    screen.keys("y")
    for question, answer in (("How many machines?", "Enter"), ("rank", "Enter"),
                             ("Address of the main machine", "127.0.0.1"), ("Port", "Enter")):
        screen.wait_for(question)
        screen.keys(answer) if answer == "Enter" else screen.keys(answer, "Enter")
    text = screen.wait_for("Rendezvous backend?")
    assert "static: each machine keeps the rank given above" in text
    assert "c10d: torch gives each machine its rank as it joins" in text


@pytest.mark.slow
def test_ctrl_c_in_a_real_terminal_keeps_the_profile(terminal, tmp_path):
    path = tmp_path / "default.yaml"
    path.write_text(EXISTING)
    screen = terminal()
    screen.wait_for("Which device should training use?")
    screen.keys("C-c")
    text = screen.wait_for("EXIT=")
    assert "EXIT=130" in text and "nothing written" in text
    assert path.read_text() == EXISTING
