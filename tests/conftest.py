"""Shared test helpers: described machines, an isolated config folder, and the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpslaunch.machine import Machine

REPO = Path(__file__).resolve().parents[1]

# Computers we do not own, described by the facts the probe would read on them.
MACHINES = {
    "m1_macos13_torch2.14": Machine("Darwin", "arm64", (13, 6), chip="Apple M1", torch_version="2.14.1", cpu_count=8, python="python3"),
    "m1_macos13_torch2.8": Machine("Darwin", "arm64", (13, 6), chip="Apple M1", torch_version="2.8.0", cpu_count=8, python="python3"),
    "m1_macos14": Machine("Darwin", "arm64", (14, 5), chip="Apple M1", torch_version="2.14.1", cpu_count=8, python="python3"),
    "m2_macos15": Machine("Darwin", "arm64", (15, 1), chip="Apple M2 Pro", torch_version="2.14.1", cpu_count=12, python="python3"),
    "m3_macos15_torch2.5": Machine("Darwin", "arm64", (15, 0), chip="Apple M3", torch_version="2.5.1", cpu_count=8, python="python3"),
    "m1_macos12_torch2.4": Machine("Darwin", "arm64", (12, 6), chip="Apple M1", torch_version="2.4.1", cpu_count=8, python="python3"),
    "m2_no_torch": Machine("Darwin", "arm64", (14, 5), chip="Apple M2", torch_version=None, cpu_count=8, python="python3"),
    "intel_mac": Machine("Darwin", "x86_64", (13, 6), chip="Intel(R) Core(TM) i7", torch_version="2.2.2", cpu_count=8, python="python3"),
    "rosetta": Machine("Darwin", "x86_64", (14, 5), rosetta=True, chip="Apple M1", torch_version="2.2.2", cpu_count=8, python="python3"),
    "linux_cpu": Machine("Linux", "x86_64", torch_version="2.14.1", torch_cuda="13.0", cpu_count=2, python="python3"),
    "linux_1gpu": Machine("Linux", "x86_64", torch_version="2.14.1", torch_cuda="13.0", cuda_devices=("NVIDIA H200",), cpu_count=16, python="python3"),
    "linux_2gpu": Machine("Linux", "x86_64", torch_version="2.14.1", torch_cuda="13.0", cuda_devices=("NVIDIA H200",) * 2, cpu_count=32, python="python3"),
    "linux_8gpu": Machine("Linux", "x86_64", torch_version="2.14.1", torch_cuda="13.0", cuda_devices=("NVIDIA H200",) * 8, cpu_count=128, python="python3"),
    "linux_gpu_cpu_torch": Machine("Linux", "x86_64", torch_version="2.14.1", torch_cuda=None, cuda_devices=("NVIDIA A100",), cpu_count=16, python="python3"),
}


@pytest.fixture(autouse=True)
def isolated_config_dir(tmp_path_factory, monkeypatch) -> Path:
    """No test ever reads or writes the real user's profiles."""
    folder = tmp_path_factory.mktemp("config")
    monkeypatch.setenv("MPSLAUNCH_CONFIG_DIR", str(folder))
    return folder


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None,
            timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """`python -m mpslaunch ARGS` in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "mpslaunch", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})},
                          cwd=cwd, **kwargs)


def write_script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(body)
    return path
