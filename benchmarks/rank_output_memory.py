"""The launcher's own peak memory while two ranks write a lot: in lines, and without a newline.

`mpslaunch launch --cpu --num_processes 2` of a script whose ranks each write `--mb` MB to
stdout in 1 MB writes, once ending each write with a newline and once never; the console is
/dev/null. The launcher's peak resident memory (VmHWM in /proc, Linux only) is read until it
exits. `--also-src DIR` runs the same two with another checkout's sources, side by side.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mpslaunch.machine import peak_resident_bytes

SCRIPT = """
import sys
end = sys.argv[1]
for _ in range(int(sys.argv[2])):
    sys.stdout.write("x" * 1_000_000 + end)
sys.stdout.flush()
"""


def peak_mb(src: str | None, script: Path, end: str, mb: int) -> tuple[float, int]:
    """The launcher's peak resident memory in MB, and its exit code."""
    env = {**os.environ, **({"PYTHONPATH": src} if src else {})}
    command = [sys.executable, "-m", "mpslaunch", "launch", "-q", "--cpu", "--num_processes", "2",
               str(script), end, str(mb)]
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env)
    peak = 0
    while launcher.poll() is None:
        peak = max(peak, peak_resident_bytes(launcher.pid) or 0)
        time.sleep(0.05)
    return peak / 2**20, launcher.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=250, help="MB each rank writes (default 250)")
    parser.add_argument("--also-src", metavar="DIR", help="another checkout's src/ to compare")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder, "write.py")
        script.write_text(SCRIPT)
        for label, src in [("this checkout", None)] + ([(args.also_src, args.also_src)]
                                                       if args.also_src else []):
            for name, end in (("in lines", "\n"), ("no newline", "")):
                peak, code = peak_mb(src, script, end, args.mb)
                print(f"{label}: 2 ranks x {args.mb} MB {name}: launcher peak {peak:.0f} MB "
                      f"(exit {code})", flush=True)


if __name__ == "__main__":
    main()
