"""--log_dir with one process: the child's stdout and stderr reach the console as before and are
also written to DIR/mpslaunch-<date>-<time>-<pid>/{stdout,stderr}.log (a new folder each run).

The child writes into pipes (so it sees no terminal), and gets PYTHONUNBUFFERED=1 so its lines
arrive as they are printed, as the ranks' do through torchrun (`python -u`).
The pipes are always drained, whatever happens to the files or the console: the child never
blocks on its output. A file write that fails (a full disk) stops both files with one warning,
and the output goes on to the console only; a console that went away is no longer written to.
When the script has ended, what it wrote is copied and the copying stops: a helper it left in a
session of its own may hold the pipes open for as long as it lives, and the run is not its.
"""

from __future__ import annotations

import errno
import os
import selectors
import subprocess
import sys
import threading
import time
from pathlib import Path

from mpslaunch import output
from mpslaunch.output import MpslaunchError
from mpslaunch.run.logdir import cannot_write, usable_log_dir

_CHUNK = 65536
_DRAIN_SECONDS = 5.0  # at most, for a console that takes the rest slowly


def run_folder(log_dir: str) -> Path:
    return usable_log_dir(log_dir) / f"mpslaunch-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


class Tee:
    def __init__(self, log_dir: str):
        self.folder = run_folder(log_dir)
        self.copies: list[threading.Thread] = []
        self.files_off = threading.Event()  # set at the first failed write: console only from then
        self.warned = threading.Lock()
        # Written once the script has ended: each copy then takes what is in its pipe and stops.
        self.ended_read, self.ended_write = os.pipe()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.files = [open(self.folder / name, "wb") for name in ("stdout.log", "stderr.log")]
        except OSError as error:
            raise MpslaunchError(cannot_write(self.folder, error)) from None

    popen_streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    environment = {"PYTHONUNBUFFERED": "1"}

    def start(self, child: subprocess.Popen) -> None:
        for pipe, console, log in (
            (child.stdout, sys.stdout, self.files[0]),
            (child.stderr, sys.stderr, self.files[1]),
        ):
            copy = threading.Thread(target=self._copy, args=(pipe, console, log), daemon=True)
            copy.start()
            self.copies.append(copy)

    def finish(self) -> None:
        """After the script's end: copy what it wrote, and stop."""
        os.write(self.ended_write, b"x")
        for copy in self.copies:
            copy.join(_DRAIN_SECONDS)
        for log in self.files:
            _close(log)
        if not any(copy.is_alive() for copy in self.copies):
            os.close(self.ended_read)
            os.close(self.ended_write)

    def _chunks(self, pipe):
        """What the pipe brings, until its end, or until the script has ended and the pipe holds
        nothing more (a helper may keep its write end open)."""
        descriptor = pipe.fileno()
        with selectors.DefaultSelector() as waiting:  # any descriptor number, unlike select()
            waiting.register(descriptor, selectors.EVENT_READ)
            waiting.register(self.ended_read, selectors.EVENT_READ)
            timeout = None  # until the script ends: wait for its output
            while True:
                ready = {key.fd for key, _ in waiting.select(timeout)}
                if descriptor not in ready:
                    if timeout == 0:  # ended, and nothing more is in the pipe
                        return
                    waiting.unregister(self.ended_read)
                    timeout = 0  # what is left was written before the end: nothing is waited for
                    continue
                chunk = os.read(descriptor, _CHUNK)
                if not chunk:
                    return
                yield chunk

    def _copy(self, pipe, console, log) -> None:
        show = _writer(console)
        for chunk in self._chunks(pipe):
            if not self.files_off.is_set():
                try:
                    log.write(chunk)
                    log.flush()
                except (OSError, ValueError) as error:
                    self._files_failed(log, error)
            if show is not None:
                try:
                    show(chunk)
                except (OSError, ValueError):  # the console went away; the files go on
                    show = None
        pipe.close()

    def _files_failed(self, log, error: Exception) -> None:
        self.files_off.set()
        if not self.warned.acquire(blocking=False):
            return  # the other stream's file failed first and said so
        output.warning(
            f"cannot write {log.name}: {_why(error)}; from here on the output goes "
            "to the console only"
        )


def _why(error: Exception) -> str:
    if getattr(error, "errno", None) == errno.ENOSPC:
        return "the disk is full (No space left on device)"
    if getattr(error, "errno", None) == errno.EDQUOT:
        return "the disk quota is used up"
    return getattr(error, "strerror", None) or str(error)


def _close(log) -> None:
    try:
        log.close()
    except OSError:  # the buffered rest of a file whose disk is full: already warned about
        pass


def _writer(console):
    if console is None:  # no stdout or stderr at all (closed when the launcher started)
        return None
    target = getattr(console, "buffer", None)
    if target is None:  # a console that takes only text (a test's capture)
        return lambda chunk: (console.write(chunk.decode(errors="replace")), console.flush())
    return lambda chunk: (target.write(chunk), target.flush())
