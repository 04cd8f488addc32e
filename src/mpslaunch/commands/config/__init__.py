"""`mpslaunch config`: write a profile (questions or --default), or show the one in force.

Interrupted questions write nothing (exit 130 for Ctrl-C, 2 for end of input); a profile is
only ever replaced whole, atomically (profile.save).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from mpslaunch import machine as machine_probe
from mpslaunch import output
from mpslaunch.launcher import prepare
from mpslaunch.machine import Machine
from mpslaunch.output import MpslaunchError
from mpslaunch.plan import decide, mps_problem, settle
from mpslaunch.settings import (
    DEFAULT,
    KNOWN_KEYS,
    MPS_KEYS,
    LaunchOptions,
    Profile,
    ProfileFile,
    Settings,
    add_option,
    add_table_options,
    check_profile,
    default_config_path,
    file_layer,
    merge,
    options_layer,
    profile_files,
    profile_layer,
    unused_default_note,
)

HELP = """\
Write a profile: the settings `mpslaunch launch` uses when no option overrides them.

With no options it asks a few questions and offers only what this machine can run,
saying why anything is left out. --default (or `config default`) writes the default
profile without questions: device auto, which picks mps on Apple silicon, then cuda,
then cpu, and one process per NVIDIA GPU (num_processes: null) on whichever machine
reads it; --device, --mixed_precision and --num_processes change those.
--from_accelerate imports an Accelerate config file. A profile that is replaced by
different text is kept as NAME.yaml.bak. `config show` prints the profile in force, where it is, and what it means here.

Profiles live in the config folder ($MPSLAUNCH_CONFIG_DIR when set): default.yaml,
which `launch` reads unless told otherwise, and NAME.yaml for --profile NAME.
Ctrl-C during the questions writes nothing.

examples:
  mpslaunch config                   answer the questions, write default.yaml
  mpslaunch config --profile cpu4    write a second profile, cpu4.yaml
  mpslaunch config default --mixed_precision bf16    no questions: auto device, bf16
  mpslaunch config --from_accelerate import Accelerate's default config
  mpslaunch config show              print the profile in force
"""
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
EXIT_END_OF_INPUT = 2


DEFAULT_CHOICES = ("device", "mixed_precision", "num_processes")  # what --default may be told


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        choices=("show", "default"),
        metavar="show|default",
        help="show: print the profile in force instead of writing one; "
        "default: the same as --default",
    )
    parser.add_argument(
        "--default",
        "--yes",
        "-y",
        dest="default",
        action="store_true",
        help="write the default profile without asking questions",
    )
    add_option(
        parser,
        "--from_accelerate",
        nargs="?",
        const="",
        metavar="PATH",
        help="write the profile an Accelerate config file means (default: Accelerate's "
        "own default config), and show it",
    )
    which = parser.add_argument_group("which profile (default: default.yaml in the config folder)")
    add_table_options(which, "profile", "config_file")
    chosen = parser.add_argument_group(
        "with --default or --from_accelerate (as `accelerate config default` takes them)"
    )
    add_table_options(chosen, *DEFAULT_CHOICES)


def main(args: argparse.Namespace) -> int:
    writes_default = args.default or args.action == "default"
    importing = getattr(args, "from_accelerate", None) is not None
    choices = {key: getattr(args, key, None) for key in DEFAULT_CHOICES}
    choices = {key: value for key, value in choices.items() if value is not None}
    if choices and not (writes_default or importing):
        raise MpslaunchError(
            f"--{next(iter(choices))} goes with `config --default`; the questions "
            "ask it (`mpslaunch config`), `config show` only prints"
        )
    if args.action == "show":
        if args.default or importing:
            raise MpslaunchError(
                "`config show` prints a profile and `--default` or "
                "`--from_accelerate` writes one; give one of them"
            )
        print(show(args.config_file, args.profile))
        return 0
    path = profile_files.profile_path(args.config_file, args.profile)
    profile_files.check_writable_place(path)
    if path.is_dir():  # say so before any question is asked, not after
        raise MpslaunchError(
            f"{path} is a folder; give --config_file the path of a .yaml file to write"
        )
    if importing:
        return from_accelerate(
            args.from_accelerate, path, machine_probe.probe(), choices, ask=not writes_default
        )
    if writes_default:
        machine = machine_probe.probe()
        profile = default_profile(
            machine, os.environ, bool(args.config_file or args.profile), **choices
        )
        return write(profile, path, machine, how_to_use(args))
    if not sys.stdin.isatty():
        raise MpslaunchError(
            "stdin is not a terminal, so the questions cannot be asked; run "
            "`mpslaunch config --default` to write the default profile, or run "
            "`mpslaunch config` in a terminal"
        )
    return interactive(path, machine_probe.probe(), how_to_use(args))


def how_to_use(args: argparse.Namespace) -> str:
    """The line after a written profile: how `launch` finds it."""
    if args.config_file:
        return f"use it with `mpslaunch launch --config_file {shlex.quote(args.config_file)} script.py`"
    if args.profile:
        return f"use it with `mpslaunch launch --profile {args.profile} script.py`"
    return "`mpslaunch launch script.py` uses it unless --profile or --config_file names another"


def interactive(path: Path, machine: Machine, use: str = "") -> int:
    """Ask, then write. Reads and draws through the current prompt_toolkit session (tests swap it)."""
    from mpslaunch.commands.config import questions

    try:
        answers = questions.ask_profile(machine, _existing(path))
    except (KeyboardInterrupt, EOFError) as stop:
        return _stopped(stop, path)
    return write(answers, path, machine, use)


def _stopped(stop: BaseException, path: Path) -> int:
    kept = f"; {path} is unchanged" if path.exists() else ""
    how = "interrupted" if isinstance(stop, KeyboardInterrupt) else "input ended"
    output.say(f"config {how}: nothing written{kept}")
    return EXIT_INTERRUPTED if isinstance(stop, KeyboardInterrupt) else EXIT_END_OF_INPUT


def from_accelerate(source: str, path: Path, machine: Machine, choices: dict, ask: bool) -> int:
    """Write the profile an Accelerate config means. On a Mac, `accelerate config default`'s
    unasked use_cpu: true is questioned (ask) or replaced by mps (--default)."""
    config_path = Path(source).expanduser() if source else default_config_path()
    if not config_path.is_file():
        raise MpslaunchError(
            f"no Accelerate config file at {config_path}; give its path: "
            "`mpslaunch config --from_accelerate PATH`"
        )
    translation = profile_files.read_accelerate(config_path)
    if translation is None:
        raise MpslaunchError(
            f"{config_path} is an mpslaunch profile, not an Accelerate config; "
            f"use it as it is with --config_file {config_path}"
        )
    print(f"Read {config_path} as an Accelerate config file.")
    for warning in translation.warnings:
        output.warning(warning)
    profile = translation.profile
    if translation.basic_cpu and mps_problem(machine) is None and "device" not in choices:
        try:
            profile = profile.replace(device="auto" if _keep_mps(ask) else "cpu")
        except (KeyboardInterrupt, EOFError) as stop:
            return _stopped(stop, path)
    settled = settle(profile_layer(profile), options_layer(LaunchOptions(**choices)))
    return write(Profile(**settled.to_dict()), path, machine)


def _keep_mps(ask: bool) -> bool:
    why = (
        "its use_cpu: true is what `accelerate config default` writes on every Mac without "
        "asking (it looks only for NVIDIA GPUs)"
    )
    if not ask:
        output.note(
            f"{why}; the profile keeps the Mac's GPU (device auto, which is mps here); "
            "give --device cpu to keep cpu"
        )
        return True
    if not sys.stdin.isatty():
        raise MpslaunchError(
            f"{why}, and stdin is not a terminal, so mpslaunch cannot ask which "
            "you want; add --default to keep mps, or --device cpu"
        )
    from mpslaunch.commands.config import questions

    return questions.keep_mps(f"This file's {why[4:]}. Train on this Mac's GPU (mps) instead?")


def default_profile(
    machine: Machine, environ: Mapping[str, str], elsewhere: bool = False, **choices
) -> Profile:
    """--default: the defaults and the choices given, checked as `launch` checks them. Without
    --num_processes the count stays null (one process per NVIDIA GPU), so that a profile in a
    home folder shared by several machines means what it says on each. `elsewhere`: the profile
    is named (--config_file, --profile), so a --device this machine lacks (a Mac's mps, written
    from Linux) is written for the machine that has it."""
    try:
        settings = decide(Profile(), LaunchOptions(**choices), machine, environ).settings
        checked = Profile(**settings.to_dict())
    except MpslaunchError as refusal:
        if "device" not in choices:
            raise
        if not elsewhere:
            raise MpslaunchError(
                f"{refusal}; or, for another machine, write it under its own "
                "name: --config_file PATH or --profile NAME"
            ) from None
        checked = Profile(**choices)  # for another machine: the rules that hold on any machine
        problem = check_profile(checked)
        if problem:
            raise MpslaunchError(problem) from None
    return checked.replace(num_processes=choices.get("num_processes"))


def write(profile: Profile, path: Path, machine: Machine, use: str = "") -> int:
    text = profile_files.to_yaml(profile, unused_keys(profile, machine))
    replaced = path.exists()
    try:
        kept = _keep_previous(path, text) if replaced else None
        profile_files.save(profile, path, unused_keys(profile, machine))
    except OSError as error:
        raise MpslaunchError(
            f"cannot write {path}: {error.strerror}; choose another place "
            "with --config_file PATH or MPSLAUNCH_CONFIG_DIR"
        ) from None
    print(
        f"{'Replaced' if replaced else 'Wrote'} {path}"
        f"{f' (the previous one is kept as {kept})' if kept else ''}:\n"
    )
    print(text)
    print(on_this_machine(ProfileFile(profile, path), machine))
    if use:
        print(use)
    return 0


def _keep_previous(path: Path, text: str) -> Path | None:
    """A profile about to be replaced by different text is copied to PATH.bak first: whatever
    wrote it (a hand, the questions, an import), nothing is lost, and no question stops a script."""
    previous = path.read_bytes()
    if previous == text.encode():
        return None
    backup = path.with_name(path.name + ".bak")
    profile_files.write_atomically(backup, previous)
    return backup


def show(config_file: str | None, profile_name: str | None, machine: Machine | None = None) -> str:
    """The profile in force, where it is and what it means on `machine` (by default this one, as
    `launch` sees it), with a note on stderr when Accelerate's default config exists and is not
    used."""
    loaded = profile_files.read_active(config_file, profile_name)
    if loaded.path is None:
        where = profile_files.profile_path(config_file, profile_name)
        denied = profile_files.denied(where)
        head = (
            f"# {where} cannot be read ({denied}): the defaults below apply; set "
            "MPSLAUNCH_CONFIG_DIR to a folder of your own"
            if denied
            else f"# no profile at {where}: the defaults below apply (write one with `mpslaunch config`)"
        )
    elif loaded.translation:
        head = f"# {loaded.path}: an Accelerate config file, read as this profile"
        head += "".join(f"\n# warning: {warning}" for warning in loaded.translation.warnings)
    else:
        head = f"# {loaded.path}"
    profile = loaded.profile
    unused = unused_keys(profile, machine or machine_probe.probe())
    body = profile_files.to_yaml(profile, unused).split("\n", 1)[1]  # no comment line
    if loaded.path:
        body = _defaults_marked(body, merge(file_layer(loaded)))
    accelerate = unused_default_note(os.environ)
    if accelerate:
        output.note(f"Accelerate's default config {accelerate}")
    return f"{head}\n{body}\n{on_this_machine(loaded, machine)}"


def _defaults_marked(body: str, settings: Settings) -> str:
    """The profile's YAML lines, those the file does not set marked as the defaults."""
    lines = []
    for line in body.splitlines():
        key = line.partition(":")[0]
        default = key in KNOWN_KEYS and key != "version" and settings.kind(key) == DEFAULT
        lines.append(f"{line}  # default" if default else line)
    return "\n".join(lines) + "\n"


def on_this_machine(loaded: ProfileFile, machine: Machine | None) -> str:
    """One line: what `mpslaunch launch script.py` would do with this profile on `machine` (by
    default this one, as `launch` sees it)."""
    try:
        decision = prepare(LaunchOptions(), loaded=loaded, machine=machine, quiet=True)
    except MpslaunchError as error:
        return f"on this machine `mpslaunch launch` would refuse: {error}"
    return f"on this machine: device {loaded.profile.device} -> {decision.choice()}"


def unused_keys(profile: Profile, machine: Machine) -> tuple[str, ...]:
    """Off a Mac the MPS keys mean nothing: left out of the file while they hold their defaults,
    unless the profile is for a Mac (device mps), wherever it is written."""
    if machine.is_mac or profile.device == "mps":
        return ()
    default = Profile()
    return tuple(key for key in MPS_KEYS if getattr(profile, key) == getattr(default, key))


def _existing(path: Path) -> Profile | None:
    """The profile already at `path`, to offer its answers as defaults; None if absent or broken."""
    if not path.exists():
        return None
    try:
        return profile_files.load(path)
    except MpslaunchError as error:
        output.warning(
            f"the existing profile cannot be used as a starting point ({error}); "
            "answering the questions replaces it"
        )
        return None
