"""Write a profile: the settings `mpslaunch launch` uses when no flag overrides them.

  mpslaunch config                    ask a few questions about what applies to this machine
  mpslaunch config --default          write the default profile, no questions (alias: --yes):
                                      device auto, one process per NVIDIA GPU (else one)
  mpslaunch config show               print the profile in force, its path, and what it
                                      resolves to on this machine
  --profile NAME / --config_file PATH choose which profile (default: default.yaml in the
                                      config folder, $MPSLAUNCH_CONFIG_DIR if set)

The questions offer only what `mpslaunch launch` accepts on this machine (devices it has,
precisions this Mac or GPU and torch can run, several processes only off mps) and say why
anything is left out. The default profile says `device: auto`, which picks mps on Apple silicon,
then cuda, then cpu; `config show` prints what auto becomes here.

The questions need a terminal: with stdin not a terminal (CI, a pipe) `mpslaunch config` stops
at once and asks for --default. Ctrl-C during the questions exits 130; end of input (Ctrl-D at
a typed answer, or closed input) exits 2. Either way nothing is written and an existing profile
stays as it was, byte for byte. The profile is
written atomically (temp file, fsync, rename).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mpslaunch import machine as machine_probe
from mpslaunch import profile as profiles
from mpslaunch.errors import MpslaunchError
from mpslaunch.machine import Machine
from mpslaunch.commands.options import add_profile_options
from mpslaunch.plan import LaunchRequest, choose_device, default_processes, resolve
from mpslaunch.profile import Profile

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C
EXIT_END_OF_INPUT = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("show",),
                        help="show: print the profile in force instead of writing one")
    parser.add_argument("--default", "--yes", "-y", dest="default", action="store_true",
                        help="write the default profile without asking (device auto)")
    add_profile_options(parser, profile_help="named profile in the config folder",
                        file_help="profile file to write or show")


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
        return write(default_profile(machine), path, machine)
    if not sys.stdin.isatty():
        raise MpslaunchError("stdin is not a terminal, so the questions cannot be asked; run "
                             "`mpslaunch config --default` to write the default profile, or run "
                             "`mpslaunch config` in a terminal")
    return interactive(path, machine_probe.probe())


def interactive(path: Path, machine: Machine) -> int:
    """Ask, then write. Reads and draws through the current prompt_toolkit session (tests swap it)."""
    from mpslaunch.commands import questions

    try:
        answers = questions.ask_profile(machine, _existing(path))
    except (KeyboardInterrupt, EOFError) as stop:
        kept = f"; {path} is unchanged" if path.exists() else ""
        how = "interrupted" if isinstance(stop, KeyboardInterrupt) else "input ended"
        print(f"mpslaunch: config {how}: nothing written{kept}", file=sys.stderr)
        return EXIT_INTERRUPTED if isinstance(stop, KeyboardInterrupt) else EXIT_END_OF_INPUT
    return write(answers, path, machine)


def default_profile(machine: Machine, **choices) -> Profile:
    """--default: the choices given, with num_processes written as auto means it here."""
    profile = Profile(**choices)
    if profile.num_processes is None:
        device, _ = choose_device(profile.device, LaunchRequest(target="script.py"), machine)
        profile = profile.replace(num_processes=default_processes(device, machine))
    return profile


def write(profile: Profile, path: Path, machine: Machine) -> int:
    replaced = path.exists()
    try:
        profiles.save(profile, path)
    except OSError as error:
        raise MpslaunchError(f"cannot write {path}: {error.strerror}; choose another place "
                             "with --config_file PATH or MPSLAUNCH_CONFIG_DIR") from None
    print(f"{'Replaced' if replaced else 'Wrote'} {path}:\n")
    print(profiles.to_yaml(profile))
    print(on_this_machine(profile, machine))
    return 0


def show(config_file: str | None, profile_name: str | None, machine: Machine) -> str:
    profile, path = profiles.load_active(config_file, profile_name)
    if path is None:
        where = profiles.profile_path(config_file, profile_name)
        head = f"# no profile at {where}: the defaults below apply (write one with `mpslaunch config`)"
    else:
        head = f"# {path}"
    body = profiles.to_yaml(profile).split("\n", 1)[1]  # drop to_yaml's own comment line
    return f"{head}\n{body}\n{on_this_machine(profile, machine)}"


def on_this_machine(profile: Profile, machine: Machine) -> str:
    """One line: what `mpslaunch launch script.py` would do here with this profile."""
    try:
        plan = resolve(profile, LaunchRequest(target="script.py"), machine, os.environ)
    except MpslaunchError as error:
        return f"on this machine `mpslaunch launch` would refuse: {error}"
    return (f"on this machine: device {profile.device} -> {plan.reason}; "
            f"precision {plan.mixed_precision}; {plan.processes_text()}")


def _existing(path: Path) -> Profile | None:
    """The profile already at `path`, to offer its answers as defaults; None if absent or broken."""
    if not path.exists():
        return None
    try:
        return profiles.load(path)
    except MpslaunchError as error:
        print(f"note: the existing profile cannot be used as a starting point ({error}); "
              "answering the questions replaces it")
        return None
