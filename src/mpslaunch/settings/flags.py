"""The command-line side of the option table (options.py): argparse arguments built from it.

Options take Accelerate's spelling (--num_processes) and, silently, the dash form
(--num-processes); --help shows one spelling per option, its default, and a one-line usage.
"""

from __future__ import annotations

from mpslaunch.settings.options import BY_NAME, REQUEST_OPTIONS, Option
from mpslaunch.settings.request import LaunchRequest

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on every launch
if TYPE_CHECKING:
    import argparse
    from types import SimpleNamespace


def spellings(name: str) -> list[str]:
    """`name`, then its dash form when it has underscores (hidden from --help)."""
    return [name] if "_" not in name else [name, name.replace("_", "-")]


def add_option(container, name: str, **kwargs) -> None:
    """Add `name` (to a parser or an argument group), with its dash form when it has underscores."""
    container.add_argument(*spellings(name), **kwargs)


def add_table_options(container, *names: str, groups: dict | None = None) -> None:
    """Add the table's options `names` to `container`, or to groups[option.group] when given."""
    for name in names:
        option = BY_NAME[name]
        target = groups.get(option.group, container) if groups else container
        _add(target, option)


def _add(container, option: Option) -> None:
    spelling = option.spelling
    if spelling is None:
        raise ValueError(f"{option.name} is a profile key only: it has no command-line flag")
    names = [*([option.short] if option.short else []), *spellings(spelling)]
    help_text = option.help + _default_text(option)
    if option.kind is bool:
        container.add_argument(
            *names,
            dest=option.name,
            action="store_const",
            const=option.const,
            default=option.request_default,
            help=help_text,
        )
        return
    metavar = option.metavar or ("{" + ",".join(option.choices) + "}" if option.choices else None)
    container.add_argument(
        *names,
        dest=option.name,
        type=_parser_of(option, spelling),
        metavar=metavar,
        default=option.request_default,
        help=help_text,
    )


def _default_text(option: Option) -> str:
    if option.kind is bool:
        return ""
    shown = option.shown_default or (
        None
        if option.default is None
        else f"{option.default:g}"
        if isinstance(option.default, float)
        else str(option.default)
    )
    return f" (default: {shown})" if shown else ""


def _parser_of(option: Option, spelling: str):
    """argparse's type= for the option: its own words for a word that is no number ("invalid
    int value"), the table's words for a value the table refuses."""

    import argparse  # only where a parser is built

    def parse(text: str) -> object:
        try:
            return option.parse(text)
        except ValueError as error:
            if str(error).startswith(spelling):
                raise argparse.ArgumentTypeError(str(error)) from None
            raise

    parse.__name__ = option.kind.__name__  # argparse names the type in some messages
    return parse


def request_from_args(
    args: argparse.Namespace | SimpleNamespace, target: str, target_args=()
) -> LaunchRequest:
    """The request the parsed flags stand for."""
    return LaunchRequest(
        target,
        tuple(target_args),
        **{option.name: getattr(args, option.name) for option in REQUEST_OPTIONS},
    )
