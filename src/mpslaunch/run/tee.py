"""--log_dir with one process: the child's stdout and stderr reach the console as before and are
also written to DIR/mpslaunch-<date>-<time>-<pid>/{stdout,stderr}.log (a new folder each run).

The child writes into pipes (so it sees no terminal), and gets PYTHONUNBUFFERED=1 so its lines
arrive as they are printed, as the ranks' do through torchrun (`python -u`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from mpslaunch.errors import MpslaunchError

_CHUNK = 65536
_DRAIN_SECONDS = 5.0  # after the child's group is gone; a daemon that kept the pipe is not waited for


def run_folder(log_dir: str) -> Path:
    return Path(log_dir).expanduser() / f"mpslaunch-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


class Tee:
    def __init__(self, log_dir: str):
        self.folder = run_folder(log_dir)
        self.copies: list[threading.Thread] = []
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.files = [open(self.folder / name, "wb") for name in ("stdout.log", "stderr.log")]
        except OSError as error:
            raise MpslaunchError(f"cannot write the output to {self.folder}: {error.strerror}; "
                                 "choose another --log_dir") from None

    popen_streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    environment = {"PYTHONUNBUFFERED": "1"}

    def start(self, child: subprocess.Popen) -> None:
        for pipe, console, log in ((child.stdout, sys.stdout, self.files[0]),
                                   (child.stderr, sys.stderr, self.files[1])):
            copy = threading.Thread(target=_copy, args=(pipe, console, log), daemon=True)
            copy.start()
            self.copies.append(copy)

    def finish(self) -> None:
        for copy in self.copies:
            copy.join(_DRAIN_SECONDS)
        for log in self.files:
            log.close()


def _copy(pipe, console, log) -> None:
    show = _writer(console)
    while chunk := os.read(pipe.fileno(), _CHUNK):
        log.write(chunk)
        log.flush()
        if show is not None:
            try:
                show(chunk)
            except (OSError, ValueError):  # the console went away; the file still gets everything
                show = None
    pipe.close()


def _writer(console):
    target = getattr(console, "buffer", None)
    if target is None:  # a console that takes only text (a test's capture)
        return lambda chunk: (console.write(chunk.decode(errors="replace")), console.flush())
    return lambda chunk: (target.write(chunk), target.flush())
