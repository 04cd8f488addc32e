"""The launcher's own lines: `mpslaunch: ` first, on stderr, so that stdout stays the script's."""

from __future__ import annotations

import sys

PREFIX = "mpslaunch: "


def error(text: str) -> None:
    """A refusal: one line, before exit code 2."""
    say(f"error: {text}")


def warning(text: str) -> None:
    """Something that may go wrong: shown even with --quiet."""
    say(f"warning: {text}")


def note(text: str, quiet: bool = False) -> None:
    """Something worth knowing that changes nothing: --quiet leaves it out."""
    if not quiet:
        say(f"note: {text}")


def say(text: str, quiet: bool = False, stream=None) -> None:
    """A line of the launcher's own, flushed before the child writes anything."""
    if not quiet:
        print(PREFIX + text, file=stream or sys.stderr, flush=True)
