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
    """argparse, but a usage error is one line (with the nearest known option and where to look)
    and exit code 2, and no abbreviations: `--num_proc` is an unknown option, never a guess."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str):
        sys.stderr.write(f"mpslaunch: error: {message}{self.nearest_options(message)} "
                         f"(see `{self.prog} --help`)\n")
        sys.exit(2)

    def nearest_options(self, message: str) -> str:
        """' (did you mean --mixed_precision?)' for the unknown options in an argparse message."""
        if not message.startswith("unrecognized arguments: "):
            return ""
        words = message.split(": ", 1)[1].split()
        found = [_nearest(word.split("=", 1)[0], self._option_string_actions) for word in words
                 if word.startswith("--")]
        found = list(dict.fromkeys(name for name in found if name))
        return f" (did you mean {' or '.join(found)}?)" if found else ""


def _nearest(word: str, options) -> str | None:
    """The known option `word` most likely means: the one it abbreviates, else the closest
    spelling (dash and underscore spellings count as one option)."""
    import difflib  # only on a usage error

    def plain(name: str) -> str:
        return name.lstrip("-").replace("-", "_")

    spellings = {}
    for name in options:  # the underscore spelling first (commands/options.py adds it first)
        if name.startswith("--"):
            spellings.setdefault(plain(name), name)
    wanted = plain(word)
    started = [key for key in spellings if key.startswith(wanted)]
    if len(started) == 1:
        return spellings[started[0]]
    close = difflib.get_close_matches(wanted, started or spellings, n=1, cutoff=0 if started else 0.6)
    return spellings[close[0]] if close else None


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
        parser.command_parser = sub
        return parser
    for name, (_, help_text) in COMMANDS.items():  # for `mpslaunch --help` and unknown commands
        commands.add_parser(name, help=help_text, description=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((word for word in argv if not word.startswith("-")), None)
    parser = build_parser(command)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own parser names the nearest option and its own --help
        getattr(parser, "command_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
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
