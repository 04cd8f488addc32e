"""The ranks' console lines, whole: one `[rankN] ` prefix per line, never one in the middle.

torch's --tee tails each rank's log file and writes whatever `readline()` returns, prefixed. A
rank runs unbuffered (`python -u`), and `print(a, b)` writes a, the space and b separately, so
the tailer can catch half a line and print the rest later under a second prefix:
`[rank0] STATE 2[rank0]  0 gloo`. During the run, sys.stdout and sys.stderr are wrapped in
`RankLines`, which keeps each rank's unfinished piece until its line ends (at "\n", or "\r" so
that progress bars still move) and writes it then, once, with one prefix. Text without a rank
prefix passes through untouched. What is still unfinished when the run ends is written then.
"""

from __future__ import annotations

import re
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, TextIO

RANK_PREFIX = re.compile(r"\[rank\d+\] ")  # torchrun_args.LINE_PREFIX, rendered
_PIECES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)")


class RankLines:
    """A text stream for torch's log tailer: joins each rank's pieces into whole lines."""

    def __init__(self, target: TextIO):
        self.target = target
        self.unfinished: dict[str, str] = {}  # prefix -> the start of its current line
        self.lock = threading.Lock()  # torch tails every rank's file in a thread of its own

    def write(self, text: str) -> int:
        match = RANK_PREFIX.match(text)
        if not match:
            self.target.write(text)
            return len(text)
        prefix, body = match.group(0), text[match.end():]
        with self.lock:
            body = self.unfinished.pop(prefix, "") + body
            lines = _PIECES.findall(body)
            done = sum(map(len, lines))
            if body[done:]:
                self.unfinished[prefix] = body[done:]
            # A bare "\r" (a progress bar's carriage return before its text) needs no prefix.
            self.target.write("".join(prefix + line for line in lines if line != "\r"))
        return len(text)

    def finish(self) -> None:
        with self.lock:
            for prefix, rest in self.unfinished.items():
                self.target.write(f"{prefix}{rest}\n")
            self.unfinished.clear()
        self.target.flush()

    def flush(self) -> None:
        self.target.flush()

    def __getattr__(self, name: str):
        return getattr(self.target, name)  # fileno, isatty, encoding, ...


@contextmanager
def whole_rank_lines() -> Iterator[None]:
    """Wrap sys.stdout and sys.stderr for the run; torch's tailer picks them up when it starts."""
    saved = sys.stdout, sys.stderr
    wrapped = [RankLines(stream) for stream in saved]
    sys.stdout, sys.stderr = wrapped
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        for stream in wrapped:
            stream.finish()
