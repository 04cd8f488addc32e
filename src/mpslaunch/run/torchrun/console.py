"""The ranks' console lines kept whole: one `[rankN] ` prefix per line, never one mid-line.

torch's --tee tailer writes whatever readline() returns, so a line a rank writes in pieces could
be split under two prefixes; RankLines holds each rank's unfinished piece until its line ends.
torch's own `[rankN]:` prefix (its excepthook, its C++ warnings) is dropped on the console for
the same rank, so each line shows one prefix; the log files keep torch's.
A line longer than MAX_HELD characters is not held whole: the console shows it in pieces of
MAX_HELD, each on a line of its own, so memory stays bounded and the splitting stays linear
(the log files keep the line as it was written); torch's tailer, which would read such a line
whole before writing it, reads at most MAX_HELD characters at a time for the run.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from mpslaunch.run.torch_internals import tails_in_pieces

RANK_PREFIX = re.compile(r"\[rank\d+\] ")  # args.LINE_PREFIX, rendered
_LINE_END = re.compile(r"\r\n|\r|\n")
MAX_HELD = 65536  # characters of one rank's unfinished line held back for its end


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
        prefix, body = match.group(0), text[match.end() :]
        with self.lock:
            lines, rest = split_lines(self.unfinished.pop(prefix, "") + body)
            if rest:
                self.unfinished[prefix] = rest
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


def split_lines(text: str) -> tuple[list[str], str]:
    """(the whole lines of `text`, each with its line end; the unfinished rest), in one pass.
    A rest longer than MAX_HELD becomes lines of MAX_HELD characters, ended with a newline."""
    lines, start = [], 0
    for end in _LINE_END.finditer(text):  # a search for line ends only: linear in the text
        lines.append(text[start : end.end()])
        start = end.end()
    while len(text) - start > MAX_HELD:
        lines.append(text[start : start + MAX_HELD] + "\n")
        start += MAX_HELD
    return lines, text[start:]


def _one_prefix(prefix: str, line: str) -> str:
    """`[rankN] ` + the line, without torch's own `[rankN]:` (and its space) for the same rank."""
    torchs = prefix.rstrip() + ":"
    if line.startswith(torchs):
        line = line[len(torchs) :]
        line = line[1:] if line.startswith(" ") else line
    return prefix + line


@contextmanager
def whole_rank_lines() -> Iterator[None]:
    """Wrap sys.stdout and sys.stderr for the run; torch's tailer picks them up when it starts."""
    saved = sys.stdout, sys.stderr
    wrapped = [RankLines(stream) for stream in saved]
    sys.stdout, sys.stderr = wrapped
    try:
        with tails_in_pieces(MAX_HELD):
            yield
    finally:
        sys.stdout, sys.stderr = saved
        for stream in wrapped:
            stream.finish()
