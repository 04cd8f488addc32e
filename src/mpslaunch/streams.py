"""The launcher's own standard streams, made safe for runs under cron, a daemon or a full disk.

A standard descriptor closed at start (`>&-`, `2>&-`) is opened on /dev/null: no file or socket
the launcher opens can take its number, a child inherits an empty stream rather than a closed
one, and Python's None for that stream becomes a stream on /dev/null. The launcher's messages go
to stderr only, never to stdout (where the script's data goes); a stderr that cannot be written
(`2>/dev/full`, a reader that went away) drops them instead of stopping the launcher.
"""

from __future__ import annotations

import os
import sys

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
