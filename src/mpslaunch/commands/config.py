"""`mpslaunch config`: write a profile (questions or --default), or show the one in force.

Interrupted questions write nothing (exit 130 for Ctrl-C, 2 for end of input); a profile is
only ever replaced whole, atomically (profile.save).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from mpslaunch import machine as machine_probe
from mpslaunch import profile as profiles
from mpslaunch.errors import MpslaunchError
from mpslaunch.machine import Machine
from mpslaunch.commands.options import add_profile_options
from mpslaunch.plan import LaunchRequest, choose_device, default_processes, resolve
from mpslaunch.profile import Profile

HELP = """\
Write a profile: the settings `mpslaunch launch` uses when no option overrides them.

With no options it asks a few questions and offers only what this machine can run,
saying why anything is left out. --default writes the default profile without
questions: device auto, which picks mps on Apple silicon, then cuda, then cpu.
`config show` prints the profile in force, where it is, and what it means here.

Profiles live in the config folder ($MPSLAUNCH_CONFIG_DIR when set): default.yaml,
which `launch` reads unless told otherwise, and NAME.yaml for --profile NAME.
Ctrl-C during the questions writes nothing.

examples:
  mpslaunch config                   answer the questions, write default.yaml
  mpslaunch config --profile cpu4    write a second profile, cpu4.yaml
  mpslaunch config show              print the profile in force
"""
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
EXIT_END_OF_INPUT = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("show",), metavar="show",
                        help="print the profile in force instead of writing one")
    parser.add_argument("--default", "--yes", "-y", dest="default", action="store_true",
                        help="write the default profile without asking questions")
    which = parser.add_argument_group("which profile (default: default.yaml in the config folder)")
    add_profile_options(which, profile_help="the profile NAME.yaml in the config folder",
                        file_help="a profile file anywhere")


def main(args: argparse.Namespace) -> int:
    if args.action == "show":
        if args.default:
            raise MpslaunchError("`config show` prints a profile and `--default` writes one; give one of them")
        print(show(args.config_file, args.profile, machine_probe.probe()))
        return 0
    path = profiles.profile_path(args.config_file, args.profile)
    if path.is_dir():  # say so before any question is asked, not after
        raise MpslaunchError(f"{path} is a folder; give --config_file the path of a .yaml file to write")
    if args.default:
        machine = machine_probe.probe()
        return write(default_profile(machine), path, machine, how_to_use(args))
    if not sys.stdin.isatty():
        raise MpslaunchError("stdin is not a terminal, so the questions cannot be asked; run "
                             "`mpslaunch config --default` to write the default profile, or run "
                             "`mpslaunch config` in a terminal")
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
    from mpslaunch.commands import questions

    try:
        answers = questions.ask_profile(machine, _existing(path))
    except (KeyboardInterrupt, EOFError) as stop:
        kept = f"; {path} is unchanged" if path.exists() else ""
        how = "interrupted" if isinstance(stop, KeyboardInterrupt) else "input ended"
        print(f"mpslaunch: config {how}: nothing written{kept}", file=sys.stderr)
        return EXIT_INTERRUPTED if isinstance(stop, KeyboardInterrupt) else EXIT_END_OF_INPUT
    return write(answers, path, machine, use)


def default_profile(machine: Machine, **choices) -> Profile:
    """--default: the choices given, with num_processes written as auto means it here."""
    profile = Profile(**choices)
    if profile.num_processes is None:
        device, _ = choose_device(profile.device, LaunchRequest(target="script.py"), machine)
        profile = profile.replace(num_processes=default_processes(device, machine))
    return profile


def write(profile: Profile, path: Path, machine: Machine, use: str = "") -> int:
    replaced = path.exists()
    try:
        profiles.save(profile, path, unused_keys(profile, machine))
    except OSError as error:
        raise MpslaunchError(f"cannot write {path}: {error.strerror}; choose another place "
                             "with --config_file PATH or MPSLAUNCH_CONFIG_DIR") from None
    print(f"{'Replaced' if replaced else 'Wrote'} {path}:\n")
    print(profiles.to_yaml(profile, unused_keys(profile, machine)))
    print(on_this_machine(profile, machine))
    if use:
        print(use)
    return 0


def show(config_file: str | None, profile_name: str | None, machine: Machine) -> str:
    profile, path = profiles.load_active(config_file, profile_name)
    if path is None:
        where = profiles.profile_path(config_file, profile_name)
        head = f"# no profile at {where}: the defaults below apply (write one with `mpslaunch config`)"
    else:
        head = f"# {path}"
    body = profiles.to_yaml(profile, unused_keys(profile, machine)).split("\n", 1)[1]  # no comment line
    return f"{head}\n{body}\n{on_this_machine(profile, machine)}"


def on_this_machine(profile: Profile, machine: Machine) -> str:
    """One line: what `mpslaunch launch script.py` would do here with this profile."""
    try:
        plan = resolve(profile, LaunchRequest(target="script.py"), machine, os.environ)
    except MpslaunchError as error:
        return f"on this machine `mpslaunch launch` would refuse: {error}"
    return f"on this machine: device {profile.device} -> {plan.choice()}"


def unused_keys(profile: Profile, machine: Machine) -> tuple[str, ...]:
    """Off a Mac the MPS keys mean nothing: left out of the file while they hold their defaults."""
    if machine.is_mac:
        return ()
    default = Profile()
    return tuple(key for key in profiles.MPS_KEYS if getattr(profile, key) == getattr(default, key))


def _existing(path: Path) -> Profile | None:
    """The profile already at `path`, to offer its answers as defaults; None if absent or broken."""
    if not path.exists():
        return None
    try:
        return profiles.load(path)
    except MpslaunchError as error:
        print(f"mpslaunch: warning: the existing profile cannot be used as a starting point "
              f"({error}); answering the questions replaces it", file=sys.stderr)
        return None
