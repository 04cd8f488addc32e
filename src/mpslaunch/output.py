"""What the launcher itself says, and where: its one error type, its own lines, its streams.

Every refusal is an MpslaunchError: a full sentence that says what to do, printed by the command
line on one line, exit code 2. The launcher's own lines start with `mpslaunch: ` and go to
stderr, so that stdout stays the script's.

The standard streams are made safe for runs under cron, a daemon or a full disk. A standard
descriptor closed at start (`>&-`, `2>&-`) is opened on /dev/null: no file or socket the
launcher opens can take its number, a child inherits an empty stream rather than a closed one,
and Python's None for that stream becomes a stream on /dev/null. A stderr that cannot be written
(`2>/dev/full`, a reader that went away) drops the launcher's lines instead of stopping it.
"""

from __future__ import annotations

import os
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
    """A line of the launcher's own, flushed before the child writes anything; dropped when
    there is no stderr or it cannot be written (DroppingStream)."""
    target = stream or sys.stderr
    if quiet or target is None:  # print(file=None) would write to stdout, the script's data
        return
    try:
        print(PREFIX + one_line(text), file=target, flush=True)
    except (OSError, ValueError):
        pass


# A name the user chose (a file name may hold a newline) must not start a line of its own, which
# could pass for one of the launcher's: control characters are shown escaped, as Python writes them.
_ESCAPED = {
    **{code: f"\\x{code:02x}" for code in (*range(32), 127) if code != 9},
    ord("\n"): "\\n",
    ord("\r"): "\\r",
}


def one_line(text: str) -> str:
    """`text` with its control characters (newline, carriage return, escape...) escaped."""
    return text.translate(_ESCAPED)


def shell_words(words) -> str:
    """A command line to copy into a shell: shlex.join, but a word with control characters is
    written $'...', so that it stays on its line."""
    import shlex

    return " ".join(
        shlex.quote(word) if one_line(word) == word else _ansi_c(word) for word in words
    )


def _ansi_c(word: str) -> str:
    return "$'" + one_line(word.replace("\\", "\\\\").replace("'", "\\'")) + "'"


# ---------------------------------------------------------------- the one error type


class MpslaunchError(Exception):
    """A usage, profile or device error. The CLI prints it on one line and exits 2."""

    exit_code = 2


def error_line(error: BaseException) -> str:
    """`Type: first line of its message`: torch's errors run to many lines, ours are one."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


# ---------------------------------------------------------------- the standard streams


_STANDARD = ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w"))


def guard_standard_streams() -> None:
    """For the command-line program, once, before anything is printed or opened."""
    for descriptor, name, mode in _STANDARD:
        if not _is_open(descriptor):
            _open_devnull_at(descriptor)
        if getattr(sys, name) is None:
            setattr(sys, name, open(descriptor, mode, closefd=False))
    if not isinstance(sys.stderr, DroppingStream):
        sys.stderr = DroppingStream(sys.stderr)


class DroppingStream:
    """A text stream that drops what its target cannot take; everything else is the target's."""

    def __init__(self, target):
        self.target = target

    def write(self, text: str) -> int:
        try:
            return self.target.write(text)
        except (OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        try:
            self.target.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str):
        return getattr(self.target, name)  # fileno, buffer, isatty, encoding, ...


def _is_open(descriptor: int) -> bool:
    try:
        os.fstat(descriptor)
    except OSError:
        return False
    return True


def _open_devnull_at(descriptor: int) -> None:
    opened = os.open(os.devnull, os.O_RDWR)
    if opened != descriptor:
        os.dup2(opened, descriptor)  # inheritable, as a standard descriptor must be
        os.close(opened)
    else:
        os.set_inheritable(descriptor, True)
