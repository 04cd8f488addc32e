"""The questions `mpslaunch config` asks: (Machine, the user's answers) -> Profile. Nothing else.

Every offer comes from the plan's own rules (never a copy), so nothing `launch` would refuse here
is offered, and what is left out is named with the plan's reason. questionary is imported only
when asking; tests drive it through prompt_toolkit's pipe input. Writes nothing.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from mpslaunch.machine import Machine, with_addresses
from mpslaunch.output import MpslaunchError
from mpslaunch.plan import (
    choose_device,
    cuda_problem,
    decide,
    main_address_problem,
    most_processes,
    mps_problem,
    precision_refusal,
    processes_problem,
)
from mpslaunch.settings import (
    DEFAULT_PORT,
    PRECISIONS,
    RDZV_BACKENDS,
    LaunchOptions,
    Profile,
    check_profile,
    check_value,
    merge,
    profile_layer,
)

_NO_FLAGS = LaunchOptions()  # the questions plan with the profile alone, as `launch` with no flags
RDZV_LABELS = {
    "static": "static: each machine keeps the rank given above",
    "c10d": "c10d: torch gives each machine its rank as it joins",
}
# Accelerate's own settings are not asked about: an existing profile's values are kept.
KEPT = (
    "gpu_ids",
    "dynamo_backend",
    "dynamo_mode",
    "dynamo_use_fullgraph",
    "dynamo_use_dynamic",
    "dynamo_use_regional_compilation",
    "debug",
    "check",
)


@dataclass(frozen=True)
class Offer:
    """The answers a question offers, and the answers left out with the plan's reason for each."""

    choices: tuple[str, ...]
    hidden: tuple[tuple[str, str], ...] = ()


# ---------------------------------------------------------------- what this machine allows


def device_offer(machine: Machine) -> Offer:
    """auto and cpu always; mps and cuda only where plan.choose_device would accept them."""
    choices, hidden = ["auto"], []
    for device, problem in (("mps", mps_problem(machine)), ("cuda", cuda_problem(machine))):
        if problem:
            hidden.append((device, problem))
        else:
            choices.append(device)
    return Offer((*choices, "cpu"), tuple(hidden))


def device_in_use(device: str, machine: Machine) -> tuple[str, str]:
    """What `device` becomes on this machine ("auto" -> mps/cuda/cpu) and the plan's reason."""
    return choose_device(merge(profile_layer(Profile(device=device))), machine)


def precision_offer(device: str, machine: Machine) -> Offer:
    """The mixed-precision modes plan.precision_refusal accepts for the device in use."""
    choices, hidden = [], []
    for precision in PRECISIONS:
        refusal = precision_refusal(precision, device, machine)
        if refusal:
            hidden.append((precision, refusal[0]))  # the reason; its advice names launch's flags
        else:
            choices.append(precision)
    return Offer(tuple(choices), tuple(hidden))


def process_counts(device: str, machine: Machine) -> tuple[int, ...]:
    """Processes per machine that plan.processes_problem accepts here: 1 on mps, one per GPU on
    cuda, up to the plan's cap on cpu (`launch` warns above one per core, and so do the questions)."""
    upper = most_processes(device, machine)
    return tuple(
        n
        for n in range(1, upper + 1)
        if processes_problem(Profile(num_processes=n), device, machine) is None
    )


def several_machines_possible(device: str, machine: Machine) -> bool:
    # As machine 1: whether this machine may be machine 0 depends on the address, asked later.
    settings = Profile(num_processes=1, num_machines=2, machine_rank=1, main_process_ip="127.0.0.1")
    return processes_problem(settings, device, machine) is None


# ---------------------------------------------------------------- the questions


def ask_profile(
    machine: Machine, start: Profile | None = None, say: Callable[[str], None] = print
) -> Profile:
    """Ask what applies to `machine`; answers default to `start` (the existing profile) where
    this machine still allows them. Raises KeyboardInterrupt (Ctrl-C) or EOFError (end of input)."""
    import questionary  # only here: the other commands never pay for prompt_toolkit

    ask = _Asker(questionary, say)
    fresh = start is None
    start = start or Profile()

    offer = device_offer(machine)
    device = ask.choose(
        "Which device should training use?",
        offer,
        default=start.device,
        labels={"auto": f"auto (here: {device_in_use('auto', machine)[1]})"},
    )
    used, _ = device_in_use(device, machine)
    counts = process_counts(used, machine)
    profile = Profile(
        device=device,
        num_processes=counts[0],  # written out, never left to auto
        **{key: getattr(start, key) for key in KEPT},
    )
    if len(counts) > 1:
        what = "GPU" if used == "cuda" else "CPU"
        # A new profile uses every GPU (one process each); on cpu one process is the safe start.
        if not fresh and start.num_processes in counts:
            default = start.num_processes
        else:
            default = counts[-1] if used == "cuda" else 1
        profile = profile.replace(
            num_processes=ask.number(
                f"How many {what} processes on this machine?", default, counts[0], counts[-1]
            )
        )
        for warning in decide(profile, _NO_FLAGS, machine, {}).warnings:
            ask.note(warning)
    elif used == "mps":
        ask.note(
            "one process: only one process can use a Mac's GPU (gloo and nccl cannot carry "
            "mps tensors)"
        )

    if several_machines_possible(used, machine) and ask.confirm(
        "Will this training run across several machines?", default=start.num_machines > 1
    ):
        profile = _ask_machines(ask, profile, start, machine)

    precision = ask.choose(
        "Mixed precision?", precision_offer(used, machine), default=start.mixed_precision
    )
    profile = profile.replace(mixed_precision=precision)

    if used == "mps":
        profile = profile.replace(
            mps_fallback=ask.confirm(
                "Run ops without an MPS kernel on the CPU (PYTORCH_ENABLE_MPS_FALLBACK)?",
                default=start.mps_fallback,
            ),
            mps_memory_cap=ask.memory_cap(start.mps_memory_cap),
        )

    _check_offered(profile, machine)
    return profile


def keep_mps(question: str) -> bool:
    """Yes (the default) keeps the Mac's GPU; raises KeyboardInterrupt or EOFError like the rest."""
    import questionary

    return questionary.confirm(question, default=True).unsafe_ask()


def _ask_machines(ask: _Asker, profile: Profile, start: Profile, machine: Machine) -> Profile:
    count = ask.number("How many machines?", max(start.num_machines, 2), 2, None)
    rank = ask.number(
        f"This machine's rank (0 is the main machine, up to {count - 1})?",
        min(start.machine_rank, count - 1),
        0,
        count - 1,
    )
    address, via_nat = _main_address(ask, machine, count, rank, start)
    port = ask.number(
        "Port on the main machine?", start.main_process_port or DEFAULT_PORT, 1, 65535
    )
    backend = ask.choose(
        "Rendezvous backend?", Offer(RDZV_BACKENDS), default=start.rdzv_backend, labels=RDZV_LABELS
    )
    return profile.replace(
        num_machines=count,
        machine_rank=rank,
        main_process_ip=address,
        main_process_ip_via_nat=via_nat,
        main_process_port=port,
        rdzv_backend=backend,
    )


def _main_address(
    ask: _Asker, machine: Machine, count: int, rank: int, start: Profile
) -> tuple[str, bool]:
    """The main address; on machine 0, one of its own (plan.main_address_problem) unless the
    user says it reaches this machine through NAT."""
    default = start.main_process_ip or ""
    while True:
        address = ask.text(
            "Address of the main machine (rank 0), as the others reach it?",
            default,
            lambda text: None if text.strip() else "give an address",
        ).strip()
        settings = Profile(num_machines=count, machine_rank=rank, main_process_ip=address)
        problem = (
            main_address_problem(settings, with_addresses(machine, address)) if rank == 0 else None
        )
        if problem is None:
            return address, False
        ask.note(problem)
        if ask.confirm(
            f"Does {address} reach this machine through NAT or port forwarding?",
            default=start.main_process_ip_via_nat,
        ):
            return address, True
        default = ""


def _check_offered(profile: Profile, machine: Machine) -> None:
    """The answers came from the plan's own offers, so resolve must accept them; say so if not."""
    problem = check_profile(profile)
    if problem:
        raise MpslaunchError(problem)
    decide(profile, _NO_FLAGS, machine, {})


class _Asker:
    """One place for how each kind of question looks; every answer is checked before it returns."""

    def __init__(self, questionary, say: Callable[[str], None]):
        self.q = questionary
        self.say = say

    def note(self, text: str) -> None:
        """An indented note, wrapped between words to the terminal's width."""
        width = min(shutil.get_terminal_size().columns, 100) - 1
        self.say(
            textwrap.fill(
                text,
                width,
                initial_indent="  ",
                subsequent_indent="    ",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )

    def choose(
        self, message: str, offer: Offer, default: str, labels: dict[str, str] | None = None
    ) -> str:
        for choice, why in offer.hidden:
            self.note(f"{choice} not offered: {why}")
        labels = labels or {}
        choices = [self.q.Choice(labels.get(c, c), value=c) for c in offer.choices]
        default = default if default in offer.choices else offer.choices[0]
        return self.q.select(message, choices=choices, default=default).unsafe_ask()

    def confirm(self, message: str, default: bool) -> bool:
        return self.q.confirm(message, default=default).unsafe_ask()

    def text(self, message: str, default: str, problem: Callable[[str], str | None]) -> str:
        """Typed text; an empty answer takes `default` (shown in brackets, not pre-filled, so
        typing replaces it rather than appending to it). A wrong answer is named on the line
        under it and the question comes again: prompt_toolkit would show a validation message on
        the terminal's last row, far from the question."""
        shown = f"{message} [{default}]" if default else message
        while True:
            answer = self.q.text(shown).unsafe_ask() or default
            why = problem(answer)
            if why is None:
                return answer
            self.note(why)

    def number(self, message: str, default: int, low: int, high: int | None) -> int:
        def problem(text: str) -> str | None:
            try:
                value = int(text.strip())
            except ValueError:
                return "give a whole number"
            if value < low or (high is not None and value > high):
                return (
                    f"give a number from {low} to {high}"
                    if high is not None
                    else f"give {low} or more"
                )
            return None

        limits = f"{low}-{high}" if high is not None else f"{low} or more"
        return int(self.text(f"{message} ({limits})", str(default), problem).strip())

    def memory_cap(self, default: float | None) -> float | None:
        def problem(text: str) -> str | None:
            if text.strip().lower() == "none":
                return None
            try:
                value = float(text)
            except ValueError:
                return "give a number such as 1.0, or none"
            return check_value("mps_memory_cap", value)

        self.note("the MPS memory cap is a multiple of the GPU's recommended working set")
        answer = self.text(
            "MPS memory cap (0.0 = no limit, up to 2.0, none = torch's 1.7)?",
            "none" if default is None else str(default),
            problem,
        ).strip()
        return None if answer.lower() == "none" else float(answer)
