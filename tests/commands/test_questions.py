"""The questionnaire, driven through real prompt_toolkit input on machines we do not own.

Keys go in through `create_pipe_input` (what a terminal would send: Enter is "\\r", the down
arrow "\\x1b[B", Ctrl-C "\\x03"); the screen goes to a DummyOutput. Every written profile must
load with profile.load and resolve with plan.resolve on the machine that answered.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from helpers import MACHINES
from mpslaunch.settings import profile_files
from mpslaunch.output import MpslaunchError
from mpslaunch.machine import Machine
from mpslaunch.plan import resolve
from mpslaunch.settings import LaunchRequest
from mpslaunch.settings import Profile
from mpslaunch.commands.config.questions import (ask_profile, device_in_use, device_offer, precision_offer,
                                     process_counts, several_machines_possible)

ENTER, DOWN, CTRL_C, BACKSPACE = "\r", "\x1b[B", "\x03", "\x7f"

M2_SONOMA = Machine(system="Darwin", arch="arm64", macos_version=(14, 5), chip="Apple M2",
                    torch_version="2.14.1", cpu_count=8, python="/usr/bin/python3")
M1_VENTURA_TORCH_28 = Machine(system="Darwin", arch="arm64", macos_version=(13, 6), chip="Apple M1",
                              torch_version="2.8.0", cpu_count=8, python="/usr/bin/python3")
M1_VENTURA_TORCH_214 = Machine(system="Darwin", arch="arm64", macos_version=(13, 6), chip="Apple M1",
                               torch_version="2.14.1", cpu_count=8, python="/usr/bin/python3")
LINUX_8_GPUS = Machine(system="Linux", arch="x86_64", torch_version="2.14.1", torch_cuda="13.0",
                       cuda_devices=("NVIDIA H200",) * 8, cpu_count=64, python="/usr/bin/python3")
LINUX_CPU = Machine(system="Linux", arch="x86_64", torch_version="2.14.1", cpu_count=16,
                    python="/usr/bin/python3")
ALL_MACHINES = (M2_SONOMA, M1_VENTURA_TORCH_28, M1_VENTURA_TORCH_214, LINUX_8_GPUS, LINUX_CPU)


def answer(machine: Machine, keys: str, start: Profile | None = None, close: bool = False):
    """Run the questionnaire with `keys` typed ahead; return (profile, notes printed)."""
    notes: list[str] = []
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        if close:
            pipe.close()
        with create_app_session(input=pipe, output=DummyOutput()):
            profile = ask_profile(machine, start, say=notes.append)
    return profile, "\n".join(notes)


def loads_and_resolves(profile: Profile, machine: Machine, tmp_path):
    path = tmp_path / "written.yaml"
    profile_files.save(profile, path)
    loaded = profile_files.load(path)
    assert loaded == profile
    return resolve(loaded, LaunchRequest(target="train.py"), machine, {})


# ---------------------------------------------------------------- what is offered


def test_m2_offers_mps_every_precision_and_one_process():
    assert device_offer(M2_SONOMA).choices == ("auto", "mps", "cpu")
    assert device_in_use("auto", M2_SONOMA)[0] == "mps"
    assert precision_offer("mps", M2_SONOMA).choices == ("no", "fp16", "bf16")
    assert process_counts("mps", M2_SONOMA) == (1,)
    assert not several_machines_possible("mps", M2_SONOMA)
    # cpu on a Mac may run several processes: that is what the mps refusal points to.
    assert process_counts("cpu", M2_SONOMA) == tuple(range(1, 4 * 8 + 1))


def test_m1_on_macos_13_hides_bf16_with_the_reason():
    offer = precision_offer("mps", M1_VENTURA_TORCH_28)
    assert offer.choices == ("no", "fp16")
    (hidden, why), = offer.hidden
    assert hidden == "bf16" and "macOS 14" in why and "13.6" in why


def test_torch_too_new_for_macos_13_hides_mps_and_auto_means_cpu():
    offer = device_offer(M1_VENTURA_TORCH_214)
    assert offer.choices == ("auto", "cpu")
    assert dict(offer.hidden)["mps"].startswith("torch 2.14.1 needs macOS 14")
    assert device_in_use("auto", M1_VENTURA_TORCH_214)[0] == "cpu"


def test_linux_with_8_gpus_offers_cuda_and_up_to_8_processes():
    assert device_offer(LINUX_8_GPUS).choices == ("auto", "cuda", "cpu")
    assert device_in_use("auto", LINUX_8_GPUS)[0] == "cuda"
    assert process_counts("cuda", LINUX_8_GPUS) == tuple(range(1, 9))
    assert several_machines_possible("cuda", LINUX_8_GPUS)


def test_linux_cpu_offers_several_cpu_processes_and_hides_fp16():
    assert device_offer(LINUX_CPU).choices == ("auto", "cpu")
    assert process_counts("cpu", LINUX_CPU) == tuple(range(1, 4 * 16 + 1))
    offer = precision_offer("cpu", LINUX_CPU)
    assert offer.choices == ("no", "bf16")
    assert "fp16" in dict(offer.hidden)


def test_cpu_processes_offered_are_exactly_those_launch_accepts():
    two_cores = MACHINES["linux_cpu"]
    offered = process_counts("cpu", two_cores)
    for count in range(1, 2 * max(offered)):
        try:
            resolve(Profile(num_processes=count), LaunchRequest(target="x.py", cpu=True), two_cores, {})
            accepted = True
        except MpslaunchError:
            accepted = False
        assert accepted == (count in offered), count
    assert 4 in offered  # `launch --cpu --num_processes 4` on 2 cores runs, with a warning


def test_notes_name_no_flag_and_wrap_between_words(monkeypatch):
    monkeypatch.setenv("COLUMNS", "50")
    _, notes = answer(LINUX_CPU, DOWN + ENTER + ENTER + "n" + ENTER)  # cpu, 1 process, no
    assert all(len(line) <= 50 for line in notes.splitlines()), notes
    assert "fp16 not offered: fp16 mixed precision does not run on cpu (Accelerate would " \
           "silently train in fp32)" in " ".join(notes.split())
    assert "--" not in notes


def test_a_wrong_answer_is_named_under_its_question_and_asked_again():
    profile, notes = answer(LINUX_8_GPUS, ENTER + "9" + ENTER + "3" + ENTER + "n" + ENTER, close=True)
    assert "give a number from 1 to 8" in notes
    assert profile.num_processes == 3


@pytest.mark.parametrize("machine", ALL_MACHINES, ids=lambda m: f"{m.chip or m.system}-{m.torch_version}")
def test_everything_offered_is_accepted_by_resolve(machine):
    for device in device_offer(machine).choices:
        used = device_in_use(device, machine)[0]
        for precision in precision_offer(used, machine).choices:
            for count in process_counts(used, machine):
                resolve(Profile(device=device, mixed_precision=precision, num_processes=count),
                        LaunchRequest(target="x.py"), machine, {})


# ---------------------------------------------------------------- driven through prompt_toolkit


def test_m2_asks_mps_questions_and_never_processes(tmp_path):
    keys = ENTER + DOWN + DOWN + ENTER + "n" + "1.5" + ENTER  # auto, bf16, no fallback, cap 1.5
    profile, notes = answer(M2_SONOMA, keys)
    assert profile == Profile(device="auto", mixed_precision="bf16", num_processes=1, mps_fallback=False,
                           mps_memory_cap=1.5)
    assert "one process" in notes and "cuda not offered" in notes
    plan = loads_and_resolves(profile, M2_SONOMA, tmp_path)
    assert plan.device == "mps" and plan.settings.num_processes == 1
    assert plan.env["PYTORCH_ENABLE_MPS_FALLBACK"] == "0"
    assert plan.env["PYTORCH_MPS_HIGH_WATERMARK_RATIO"] == "1.5"


def test_m1_on_macos_13_says_why_bf16_is_missing(tmp_path):
    profile, notes = answer(M1_VENTURA_TORCH_28, ENTER + DOWN + ENTER + ENTER + ENTER)
    assert profile.mixed_precision == "fp16" and profile.mps_memory_cap is None
    assert "bf16 not offered: bf16 on mps needs macOS 14" in notes
    assert loads_and_resolves(profile, M1_VENTURA_TORCH_28, tmp_path).device == "mps"


def test_linux_8_gpus_defaults_to_every_gpu_and_refuses_a_ninth(tmp_path):
    profile, _ = answer(LINUX_8_GPUS, ENTER + ENTER + "n" + ENTER)
    assert profile.num_processes == 8
    profile, _ = answer(LINUX_8_GPUS, ENTER + "9" + ENTER + BACKSPACE + "3" + ENTER + "n" + DOWN + DOWN + ENTER)
    assert (profile.num_processes, profile.mixed_precision) == (3, "bf16")
    plan = loads_and_resolves(profile, LINUX_8_GPUS, tmp_path)
    assert (plan.device, plan.settings.num_processes, plan.engine) == ("cuda", 3, "torchrun")


def test_several_machines_only_after_a_yes(tmp_path):
    keys = ENTER + "2" + ENTER + "y" + "2" + ENTER + "1" + ENTER + "10.0.0.1" + ENTER + ENTER + ENTER + ENTER
    profile, _ = answer(LINUX_8_GPUS, keys)
    assert (profile.num_machines, profile.machine_rank, profile.main_process_ip,
            profile.main_process_port, profile.rdzv_backend) == (2, 1, "10.0.0.1", 29500, "static")
    plan = loads_and_resolves(profile, LINUX_8_GPUS, tmp_path)
    assert plan.world_size == 4


def test_machine_0_takes_only_its_own_address_unless_it_is_behind_nat(tmp_path):
    """plan.main_address_problem, asked as the address is typed (no connection is made)."""
    machine = Machine(system="Linux", arch="x86_64", torch_version="2.14.1", torch_cuda="13.0",
                      cuda_devices=("NVIDIA H200",) * 8, cpu_count=64, python="/usr/bin/python3",
                      addresses=("127.0.0.1", "192.168.1.5"))
    two_machines_rank_0 = ENTER + "2" + ENTER + "y" + "2" + ENTER + "0" + ENTER
    rest = ENTER + ENTER + ENTER  # port, backend, precision
    profile, notes = answer(machine, two_machines_rank_0 + "10.0.0.1" + ENTER + "n"
                            + "192.168.1.5" + ENTER + rest)
    assert "main_process_ip 10.0.0.1 is not an address of this machine" in notes
    text = " ".join(notes.split())  # notes wrap to the terminal's width
    assert text.count("is not an address of this machine") == 1 and "(192.168.1.5)" in text
    assert (profile.main_process_ip, profile.main_process_ip_via_nat) == ("192.168.1.5", False)
    profile, _ = answer(machine, two_machines_rank_0 + "10.0.0.1" + ENTER + "y" + rest)
    assert (profile.main_process_ip, profile.main_process_ip_via_nat) == ("10.0.0.1", True)
    loads_and_resolves(profile, machine, tmp_path)


def test_linux_cpu_asks_for_cpu_processes(tmp_path):
    profile, notes = answer(LINUX_CPU, DOWN + ENTER + "4" + ENTER + "n" + DOWN + ENTER)
    assert profile == Profile(device="cpu", num_processes=4, mixed_precision="bf16")
    assert "fp16 not offered" in notes
    plan = loads_and_resolves(profile, LINUX_CPU, tmp_path)
    assert (plan.device, plan.settings.num_processes) == ("cpu", 4)


def test_existing_answers_are_the_defaults():
    start = Profile(device="mps", mixed_precision="bf16", num_processes=1, mps_fallback=False,
                    mps_memory_cap=1.2, dynamo_backend="inductor", debug=True)  # those two: not asked
    profile, _ = answer(M2_SONOMA, ENTER * 4, start=start)
    assert profile == start


def test_an_existing_answer_this_machine_refuses_is_not_the_default():
    profile, _ = answer(M1_VENTURA_TORCH_28, ENTER * 4, start=Profile(device="cuda", mixed_precision="bf16"))
    assert (profile.device, profile.mixed_precision) == ("auto", "no")


def test_ctrl_c_and_end_of_input_stop_the_questions():
    with pytest.raises(KeyboardInterrupt):
        answer(M2_SONOMA, ENTER + CTRL_C)
    with pytest.raises(EOFError):
        answer(M2_SONOMA, ENTER, close=True)


@pytest.mark.slow
def test_importing_the_module_does_not_import_questionary():
    code = ("import sys, mpslaunch.commands.config.questions, mpslaunch.commands.config; "
            "print(sorted(m for m in ('questionary', 'prompt_toolkit', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
