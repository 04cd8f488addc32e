"""The ranks' console lines kept whole: one `[rankN] ` prefix per line, never one mid-line.

torch's --tee tailer writes whatever readline() returns, so a line a rank writes in pieces could
be split under two prefixes; RankLines holds each rank's unfinished piece until its line ends.
torch's own `[rankN]:` prefix (its excepthook, its C++ warnings) is dropped on the console for
the same rank, so each line shows one prefix; the log files keep torch's.
"""

from __future__ import annotations

import re
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, TextIO

RANK_PREFIX = re.compile(r"\[rank\d+\] ")  # args.LINE_PREFIX, rendered
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
            self.target.write("".join(_one_prefix(prefix, line) for line in lines if line != "\r"))
        return len(text)

    def finish(self) -> None:
        with self.lock:
            for prefix, rest in self.unfinished.items():
                self.target.write(_one_prefix(prefix, rest + "\n"))
            self.unfinished.clear()
        self.target.flush()

    def flush(self) -> None:
        self.target.flush()

    def __getattr__(self, name: str):
        return getattr(self.target, name)  # fileno, isatty, encoding, ...


def _one_prefix(prefix: str, line: str) -> str:
    """`[rankN] ` + the line, without torch's own `[rankN]:` (and its space) for the same rank."""
    torchs = prefix.rstrip() + ":"
    if line.startswith(torchs):
        line = line[len(torchs):]
        line = line[1:] if line.startswith(" ") else line
    return prefix + line


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
