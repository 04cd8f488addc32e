"""mpslaunch: launch PyTorch training on your own machine, Apple silicon first.

    mpslaunch config [--default] [--profile NAME | --config_file PATH]   write a profile
    mpslaunch config show [--profile NAME | --config_file PATH]          print the profile in force
    mpslaunch launch [options] script.py [script args...]                run a script with the plan
    mpslaunch env                                                        report for bug reports
    mpslaunch bench [options]                                            is the GPU faster than the CPU?
    mpslaunch test [--profile NAME | --config_file PATH]                 self-test of the launch path

Each command lives in a module that offers add_arguments(parser) and main(args) -> int; only the
chosen command's module is imported, and none imports torch or questionary at the top, so
`launch` starts fast.
Exit codes: the script's own code; 128+N when signal N killed it; 2 for a usage, profile or
device error, printed as one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from mpslaunch import __version__
from mpslaunch.errors import MpslaunchError

# name -> (module, one-line help). Only the chosen command's module is imported.
COMMANDS = {
    "config": ("mpslaunch.commands.config", "write a profile (questionnaire or --default), or show one"),
    "launch": ("mpslaunch.commands.launch", "run a training script on the device this machine should use"),
    "env": ("mpslaunch.commands.env", "print a block of facts to paste into a bug report"),
    "bench": ("mpslaunch.commands.bench", "measure whether the accelerator beats the CPU for your sizes"),
    "test": ("mpslaunch.commands.test", "check, through the real launch path, that the plan works here"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with where to look) and exit code 2."""

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


def build_parser(command: str | None) -> OneLineParser:
    parser = OneLineParser(prog="mpslaunch", description=__doc__.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"mpslaunch {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    if command in COMMANDS:
        # Only the chosen command: building a parser per command costs time on every launch.
        module_name, help_text = COMMANDS[command]
        module = importlib.import_module(module_name)
        sub = commands.add_parser(command, help=help_text, description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(handler=module.main)
        return parser
    for name, (_, help_text) in COMMANDS.items():  # for `mpslaunch --help` and unknown commands
        commands.add_parser(name, help=help_text, description=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((word for word in argv if not word.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.handler(args)
    except MpslaunchError as error:
        print(f"mpslaunch: error: {error}", file=sys.stderr)
        return error.exit_code
    except BrokenPipeError:
        return 0  # `mpslaunch env | head` closed the pipe early: not an error


if __name__ == "__main__":
    sys.exit(main())
