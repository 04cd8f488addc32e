"""The command line: the table of commands, the parser built from it (parser.py holds its
argparse side), and `main`, which hands the parsed command line to the chosen command's module
(one module or package per command here).

Each command module offers HELP (its --help text), add_arguments(parser) and main(args) -> int,
and may offer explain_unknown(word) -> str | None: the usage error for a word its parser does not
take, read only on that error path (launch's for Accelerate's options it refuses); and
without_options(words): the parsed command line when the words after the command's name give it
no option, read without a parser (launch's for a script and its arguments: argparse is then not
even imported). Only the chosen command's module is imported, and none imports torch or
questionary at the top, so `launch` starts fast. An MpslaunchError becomes one line on stderr
and its exit code.
"""

from __future__ import annotations

import importlib
import os
import sys

from mpslaunch import __version__, output
from mpslaunch.output import MpslaunchError, guard_standard_streams

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from mpslaunch.commands.parser import OneLineParser

HELP = """\
Launch PyTorch training on your own machine: mps on Apple silicon, cuda on NVIDIA
GPUs, cpu otherwise. Scripts written for Hugging Face Accelerate run unchanged.

examples:
  mpslaunch config --default        write the default profile
  mpslaunch launch train.py         run train.py on the device this machine should use
  mpslaunch env                     print the facts a bug report needs
"""
EPILOG = "Run `mpslaunch COMMAND --help` for a command's options and examples."

# name -> (module, one-line help). Only the chosen command's module is imported.
COMMANDS = {
    "config": (
        "mpslaunch.commands.config",
        "write a profile (questionnaire or --default), or show one",
    ),
    "launch": (
        "mpslaunch.commands.launch",
        "run a training script on the device this machine should use",
    ),
    "env": ("mpslaunch.commands.env", "print a block of facts to paste into a bug report"),
    "bench": (
        "mpslaunch.commands.bench",
        "measure whether the accelerator beats the CPU for your sizes",
    ),
    "test": (
        "mpslaunch.commands.test",
        "check, through the real launch path, that the plan works here",
    ),
    "check": (
        "mpslaunch.commands.check",
        "read a script (never run it) for what will break it on this plan",
    ),
}


def build_parser(command: str | None) -> OneLineParser:
    from mpslaunch.commands.parser import OneLineParser

    description, examples = _split_help(HELP)
    parser = OneLineParser(
        prog="mpslaunch", description=description, epilog=f"{examples}\n\n{EPILOG}"
    )
    parser.add_argument("--version", action="version", version=f"mpslaunch {__version__}")
    # prog given: argparse would otherwise build a help formatter (and import shutil) to find it.
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", title="commands", prog="mpslaunch"
    )
    if command in COMMANDS:
        # Only the chosen command: building a parser per command costs time on every launch.
        module_name, help_text = COMMANDS[command]
        module = importlib.import_module(module_name)
        description, examples = _split_help(module.HELP)
        sub = commands.add_parser(command, help=help_text, description=description, epilog=examples)
        module.add_arguments(sub)
        sub.set_defaults(handler=module.main)
        sub.explain_unknown = getattr(module, "explain_unknown", None)
        parser.command_parser = sub
        return parser
    for name, (_, help_text) in COMMANDS.items():  # for `mpslaunch --help` and unknown commands
        commands.add_parser(name, help=help_text, description=help_text)
    return parser


def _split_help(text: str) -> tuple[str, str]:
    """A HELP text's description, and its examples block, which --help shows after the options."""
    description, marker, examples = text.partition("\nexamples:\n")
    return description.strip(), (marker.strip() + "\n" + examples.rstrip()) if marker else ""


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the program itself, not a caller in its own process
        guard_standard_streams()
    argv = sys.argv[1:] if argv is None else argv
    command = next((word for word in argv if not word.startswith("-")), None)
    if (
        command is not None
        and command not in COMMANDS
        and not {"-h", "--help", "--version"} & set(argv)
    ):
        output.error(unknown_command(argv, command))
        return 2
    args = _without_options(argv)
    if args is None:
        parser = build_parser(command)
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # the command's own parser explains them, or names the nearest option
            getattr(parser, "command_parser", parser).reject_unknown(unknown)
        if not getattr(args, "handler", None):
            parser.print_help(sys.stderr)
            return 2
    try:
        return args.handler(args)
    except MpslaunchError as error:
        output.error(str(error))
        return error.exit_code
    except BrokenPipeError:
        return 0  # `mpslaunch env | head` closed the pipe early: not an error


def _without_options(argv: list[str]):
    """`COMMAND WORDS...` as the parser would read it, when the command reads its words without
    one (its module's `without_options`) and they give it no option; else None."""
    if not argv or argv[0] not in COMMANDS:
        return None
    module = importlib.import_module(COMMANDS[argv[0]][0])
    read = getattr(module, "without_options", None)
    return read(argv[1:]) if read else None


def unknown_command(argv: list[str], word: str) -> str:
    """A script where the command goes (torchrun's habit) or a typo: the command line meant."""
    import difflib  # only on a usage error

    at = argv.index(word)
    if word.endswith(".py") or os.path.isfile(word):
        meant: list[str] | None = ["launch", *argv]
    else:
        close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
        meant = [*argv[:at], close[0], *argv[at + 1 :]] if close else None
    listed = f"the commands are {', '.join(COMMANDS)} (see `mpslaunch --help`)"
    if meant is None:
        return f"unknown command {word!r}; {listed}"
    return (
        f"unknown command {word!r} (did you mean `{output.shell_words(['mpslaunch', *meant])}`?); "
        f"{listed}"
    )
