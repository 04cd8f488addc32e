"""The command line's parser: argparse, with one-line usage errors (the nearest option named,
a command's own explanation of a word it refuses) and --help for people (one spelling per
option, a one-line usage). Imported only when a command line is parsed with options: a launch
of a script with none reads it without a parser (commands/launch.py, `without_options`).
"""

from __future__ import annotations

import argparse
import os
import sys

from mpslaunch import output

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with the nearest known option and where to look)
    and exit code 2, and no abbreviations: `--num_proc` is an unknown option, never a guess."""

    command_parser: OneLineParser  # the chosen command's, once build_parser adds it
    explain_unknown: Callable[[str], str | None] | None = None  # the command module's, if any

    def __init__(self, *args, **kwargs):
        super().__init__(
            *args,
            **{
                "allow_abbrev": False,
                "exit_on_error": False,
                "formatter_class": HelpFormatter,
                **kwargs,
            },
        )

    def parse_known_args(self, args=None, namespace=None):
        try:
            return super().parse_known_args(args, namespace)
        except argparse.ArgumentError as problem:
            # A word the command explains, typed before the option argparse stopped at, came first.
            self.error(self.explained(_before(args, problem)) or _wording(problem))

    def reject_unknown(self, words: list[str]) -> NoReturn:
        """The usage error for words no parser took: the command's explanation of the first one
        it knows, else "unrecognized arguments" with the nearest options."""
        self.error(self.explained(words) or f"unrecognized arguments: {' '.join(words)}")

    def explained(self, words: list[str]) -> str | None:
        """The command's own usage error (explain_unknown) for the first of `words` it knows."""
        explain = self.explain_unknown
        return next(filter(None, map(explain, words)), None) if explain else None

    def error(self, message: str) -> NoReturn:
        output.error(f"{message}{self.nearest_options(message)} (see `{self.prog} --help`)")
        sys.exit(2)

    def nearest_options(self, message: str) -> str:
        """' (did you mean --mixed_precision?)' for the unknown options in an argparse message."""
        if not message.startswith("unrecognized arguments: "):
            return ""
        words = [
            word.split("=", 1)[0]
            for word in message.split(": ", 1)[1].split()
            if word.startswith("--")
        ]
        # An option of this command that it did not take was given before the command's name.
        misplaced = [word for word in words if word in self._option_string_actions]
        if misplaced:
            names, one = " ".join(misplaced), len(misplaced) == 1
            return (
                f" ({names} {'is an option' if one else 'are options'} of `{self.prog}`: "
                f"give {'it' if one else 'them'} after `{self.prog.split()[-1]}`, as in "
                f"`{self.prog} {names} ...`)"
            )
        nearest = [_nearest(word, self._option_string_actions) for word in words]
        found = list(dict.fromkeys(name for name in nearest if name))
        return f" (did you mean {' or '.join(found)}?)" if found else ""


def _wording(problem: argparse.ArgumentError) -> str:
    """A value the option table refused reads `--name why` (the table's words); argparse's own
    problems name the option by its one shown spelling."""
    if problem.argument_name is None:
        return problem.message
    names = problem.argument_name.split("/")
    if problem.message.startswith(tuple(f"{name} " for name in names)):
        return problem.message
    return f"argument {names[0]}: {problem.message}"


def _before(words: list[str] | None, problem: argparse.ArgumentError) -> list[str]:
    """The words before the option argparse stopped at, found by its name (`--name`,
    `--name=value`): options and their values only, never the script or its arguments. None
    of them when it is not found so (a positional, `-t3`)."""
    names = (problem.argument_name or "").split("/")
    named = [at for at, word in enumerate(words or ()) if word.split("=", 1)[0] in names]
    return words[: named[0]] if words and named and names[0].startswith("-") else []


def _nearest(word: str, options) -> str | None:
    """The known option `word` most likely means: the one it abbreviates, else the closest
    spelling (dash and underscore spellings count as one option)."""
    import difflib  # only on a usage error

    def plain(name: str) -> str:
        return name.lstrip("-").replace("-", "_")

    spellings: dict[str, str] = {}
    for name in options:  # the underscore spelling first (settings/flags.py adds it first)
        if name.startswith("--"):
            spellings.setdefault(plain(name), name)
    wanted = plain(word)
    started = [key for key in spellings if key.startswith(wanted)]
    if len(started) == 1:
        return spellings[started[0]]
    close = difflib.get_close_matches(
        wanted, started or spellings, n=1, cutoff=0 if started else 0.6
    )
    return spellings[close[0]] if close else None


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help for people: one spelling per option (the dash form of an underscore option is
    accepted but not shown), and a one-line usage: `PROG [options] POSITIONALS`."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ):
        # argparse makes a formatter for every add_argument; its own width lookup imports shutil.
        super().__init__(
            prog,
            indent_increment,
            max_help_position,
            width if width is not None else _terminal_columns() - 2,
        )

    def _format_action_invocation(self, action: argparse.Action) -> str:
        shown = [name for name in action.option_strings if not _hidden_alias(name, action)]
        if not shown or action.nargs == 0:
            return ", ".join(shown) or super()._format_action_invocation(action)
        value = self._format_args(action, self._get_default_metavar_for_optional(action))
        return ", ".join(shown) + " " + value

    def _format_usage(self, usage, actions, groups, prefix) -> str:
        if usage is None:
            positionals = [action for action in actions if not action.option_strings]
            words = self._format_actions_usage(positionals, groups).strip()
            usage = " ".join(
                [
                    "%(prog)s",
                    *(["[options]"] if len(positionals) < len(actions) else []),
                    *([words] if words else []),
                ]
            )
        return super()._format_usage(usage, actions, groups, prefix)


def _terminal_columns() -> int:
    """shutil.get_terminal_size()'s columns: $COLUMNS, else the terminal's, else 80."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    if sys.__stdout__ is None:  # Python started without a standard output
        return 80
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 80


def _hidden_alias(name: str, action: argparse.Action) -> bool:
    """The dash spelling of an option whose underscore spelling is also there."""
    return (
        "-" in name[2:] and name.replace("-", "_").replace("__", "--", 1) in action.option_strings
    )
