"""What the tests share besides fixtures: described machines, the CLI in a subprocess, waiting
for a process or a file, refusals' shape, small disks, Accelerate's config writers, a stand-in
libproc, and SLURM's environments and the local SLURM's commands. conftest.py keeps the
fixtures and hooks; every test file imports these from here (`from helpers import run_cli`)."""

from __future__ import annotations

import dataclasses
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from mpslaunch.machine import Machine, MpsAnswer
from mpslaunch.output import MpslaunchError

REPO = Path(__file__).resolve().parents[1]

# torch's verdicts, as a check in a child leaves them (docs/mps-facts.md: Detecting MPS).
MPS_WORKS = MpsAnswer(True, "works", "", "2026-03-19 14:02")
MPS_UNAVAILABLE_ON_26 = MpsAnswer(  # pytorch/pytorch#177819: macOS 26.3.1, torch 2.10
    False, "torch.backends.mps.is_available() is False (RuntimeError: The MPS backend is "
    "supported on macOS 14.0+. Current OS version can be queried using `sw_vers`)",
    "update torch (pip install -U torch), then run `mpslaunch env` to check again", "2026-03-19 14:02")

# Computers we do not own, described by the facts the probe would read on them. A Mac where torch
# was never asked (mps_answer None) makes a launch that plans mps ask torch in a real child.
MACHINES = {
    "m1_macos13_torch2.14": Machine("Darwin", "arm64", (13, 6), chip="Apple M1", torch_version="2.14.1", cpu_count=8, python="python3"),
    "m1_macos13_torch2.8": Machine("Darwin", "arm64", (13, 6), chip="Apple M1", torch_version="2.8.0", cpu_count=8, python="python3", mps_answer=MPS_WORKS),
    "m1_macos14": Machine("Darwin", "arm64", (14, 5), chip="Apple M1", torch_version="2.14.1", cpu_count=8, python="python3", mps_answer=MPS_WORKS),
    "m2_macos15": Machine("Darwin", "arm64", (15, 1), chip="Apple M2 Pro", torch_version="2.14.1", cpu_count=12, python="python3", mps_answer=MPS_WORKS),
    "m3_macos15_torch2.5": Machine("Darwin", "arm64", (15, 0), chip="Apple M3", torch_version="2.5.1", cpu_count=8, python="python3", mps_answer=MPS_WORKS),
    "m1_macos12_torch2.4": Machine("Darwin", "arm64", (12, 6), chip="Apple M1", torch_version="2.4.1", cpu_count=8, python="python3", mps_answer=MPS_WORKS),
    "m2_no_torch": Machine("Darwin", "arm64", (14, 5), chip="Apple M2", torch_version=None, cpu_count=8, python="python3"),
    "m3_macos14": Machine("Darwin", "arm64", (14, 7), chip="Apple M3 Pro", torch_version="2.14.1", cpu_count=12, python="python3", mps_answer=MPS_WORKS),
    "m4_macos15": Machine("Darwin", "arm64", (15, 5), chip="Apple M4 Max", torch_version="2.14.1", cpu_count=16, python="python3", mps_answer=MPS_WORKS),
    "m4_macos26.0": Machine("Darwin", "arm64", (26, 0), chip="Apple M4", torch_version="2.14.1", cpu_count=10, python="python3", mps_answer=MPS_WORKS),
    "m2_macos26.3": Machine("Darwin", "arm64", (26, 3), chip="Apple M2 Max", torch_version="2.14.1", cpu_count=12, python="python3"),
    "m2_macos26.3_torch_says_no": Machine("Darwin", "arm64", (26, 3, 1), chip="Apple M2 Max", torch_version="2.10.0", cpu_count=12, python="python3", mps_answer=MPS_UNAVAILABLE_ON_26),
    "mac_vm": Machine("Darwin", "arm64", (15, 7), chip="Apple M1 (Virtual)", torch_version="2.14.1", cpu_count=3, python="python3", virtual_machine=True),
    "intel_mac": Machine("Darwin", "x86_64", (13, 6), chip="Intel(R) Core(TM) i7", torch_version="2.2.2", cpu_count=8, python="python3"),
    "rosetta": Machine("Darwin", "x86_64", (14, 5), rosetta=True, chip="Apple M1", torch_version="2.2.2", cpu_count=8, python="python3"),
    "linux_cpu": Machine("Linux", "x86_64", torch_version="2.14.1", torch_cuda="13.0", cpu_count=2, python="python3"),
    "linux_1gpu": Machine("Linux", "x86_64", torch_version="2.14.1", torch_cuda="13.0", cuda_devices=("NVIDIA H200",), cpu_count=16, python="python3"),
    "linux_2gpu": Machine("Linux", "x86_64", torch_version="2.14.1", torch_cuda="13.0", cuda_devices=("NVIDIA H200",) * 2, cpu_count=32, python="python3"),
    "linux_8gpu": Machine("Linux", "x86_64", torch_version="2.14.1", torch_cuda="13.0", cuda_devices=("NVIDIA H200",) * 8, cpu_count=128, python="python3"),
    "linux_gpu_cpu_torch": Machine("Linux", "x86_64", torch_version="2.14.1", torch_cuda=None, cuda_devices=("NVIDIA A100",), cpu_count=16, python="python3"),
}


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 120,
            config_dir: Path | None = None, python_options: tuple[str, ...] = (),
            **kwargs) -> subprocess.CompletedProcess:
    """`python [PYTHON_OPTIONS] -m mpslaunch ARGS` in a subprocess, as a user runs it;
    `config_dir`: the profiles' folder (MPSLAUNCH_CONFIG_DIR). Its stdin is never a terminal."""
    if "input" not in kwargs:
        kwargs.setdefault("stdin", subprocess.DEVNULL)
    env = {**os.environ, **({"MPSLAUNCH_CONFIG_DIR": str(config_dir)} if config_dir else {}), **(env or {})}
    return subprocess.run([sys.executable, *python_options, "-m", "mpslaunch", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, **kwargs)


def one_line_error(result: subprocess.CompletedProcess, longest: int | None = None) -> str:
    """The refusal's one line: exit code 2, `mpslaunch: error: ...` alone on stderr, no
    traceback (and at most `longest` characters)."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("mpslaunch: error: "), lines[0][:300]
    assert longest is None or len(lines[0]) <= longest, lines[0][:300]
    return lines[0]


def refusal_of(call) -> str | None:
    """call()'s MpslaunchError message, or None when it returns; any other exception fails."""
    try:
        call()
    except MpslaunchError as error:
        return str(error)
    return None


def wait_for(condition, seconds: float = 30.0):
    """condition()'s first true value, asked every 0.05 s; its last (false) value after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(0.05)


def file_line(path: Path, seconds: float = 30.0) -> str:
    """The text of `path` once its writer has finished a line (it ends with a newline)."""
    def written() -> str | None:
        text = path.read_text() if path.exists() else ""
        return text if text.endswith("\n") else None

    text = wait_for(written, seconds)
    assert text, f"{path} never appeared"
    return text


class Lines:
    """A running process's text stream (its stderr, say), read line by line by a thread of its
    own, so a test can wait for one line without blocking forever and read the rest later."""

    def __init__(self, stream):
        self.lines: queue.Queue = queue.Queue()
        self.read: list[str] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)  # the end of the stream

    def wait_for(self, start: str, seconds: float = 90) -> str:
        """The first line (without its newline) that starts with `start`."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no line starting {start!r} in {seconds} s: {self.read}") from None
            assert line is not None, f"the stream ended without a line starting {start!r}: {self.read}"
            self.read.append(line)
            if line.startswith(start):
                return line.rstrip("\n")

    def rest(self, seconds: float = 90) -> str:
        """Everything read, once the stream has ended."""
        deadline = time.monotonic() + seconds
        while (line := self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))) is not None:
            self.read.append(line)
        self.lines.put(None)
        return "".join(self.read)


RANK_PREFIX = re.compile(r"^\[rank\d+\] ")  # the launcher's prefix on each rank's console line


def own_lines(output: str, *starts: str) -> list[str]:
    """The lines of a run's output that the test's own code printed, whole: those whose text,
    after the `[rankN] ` prefix, begins with one of `starts`. torch and gloo print on the ranks'
    stdout too (`[Gloo] Rank 0 is connected to 1 peer ranks...`, warnings), in words that change
    from release to release; a test compares only its own lines, which it marks."""
    return [line for line in output.splitlines()
            if RANK_PREFIX.sub("", line, count=1).startswith(starts)]


# The CLI run with an Apple M4 Max's platform facts (os.uname and sysctl's answers, macOS 15.5
# build DESCRIBED_MAC_BUILD); everything else is real. `python -c ON_A_MAC_CLI ARGS`.
DESCRIBED_MAC_BUILD = "24F74"
ON_A_MAC_CLI = """
import os, sys
from mpslaunch import commands as cli
from mpslaunch.machine import facts as machine
os.uname = lambda: os.uname_result(("Darwin", "mac", "25.3.0", "", "arm64"))
machine._mac_sysctls = lambda: {"kern.osproductversion": "15.5", "kern.osversion": "%s",
                                "machdep.cpu.brand_string": "Apple M4 Max", "kern.hv_vmm_present": "0"}
sys.exit(cli.main(sys.argv[1:]))
""" % DESCRIBED_MAC_BUILD


def two_gloo_ranks_ended_well(result: subprocess.CompletedProcess) -> bool:
    """Two gloo ranks whose script returned: exit 0, or torch's known abort at interpreter exit
    after the script had returned (SIGABRT, exit 134, pytorch/pytorch#190489; about 1 run in 5),
    which the launcher names. No test passes or fails on which of the two happened: the caller
    checks what the ranks printed or wrote either way."""
    if result.returncode == 134:
        return "aborted in torch's exit after the script had returned" in result.stderr
    return result.returncode == 0


def write_script(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(body)
    return path


@contextmanager
def small_disk(folder: Path, size: str):
    """A tmpfs of `size` (such as "1m") mounted on the new `folder`, unmounted at the end: a disk
    that really fills up. It needs root; elsewhere the test skips with the reason."""
    with _tmpfs(folder, f"size={size}", "a small tmpfs (a disk that fills up)"):
        yield folder


@contextmanager
def read_only_disk(folder: Path):
    """A tmpfs mounted read-only on the new `folder` (EROFS on every write, even root's),
    unmounted at the end. It needs root; elsewhere the test skips with the reason."""
    with _tmpfs(folder, "ro,size=1m", "a read-only tmpfs"):
        yield folder


@contextmanager
def _tmpfs(folder: Path, options: str, what: str):
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip(f"mounting {what} needs root")
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], capture_output=True)


# Accelerate's own config writers, for the tests of its files (settings/ and commands/).


def basic_config(folder: Path, mixed_precision: str = "no", monkeypatch=None) -> Path:
    """`accelerate config default` as it runs on a Mac: Accelerate looks only for CUDA (and other
    non-Apple accelerators), finds none, and writes use_cpu: true."""
    import torch
    from accelerate.commands.config.default import write_basic_config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = folder / "default_config.yaml"
    write_basic_config(mixed_precision=mixed_precision, save_location=str(path))
    return path


def cluster_config(path: Path, distributed_type: str, as_json: bool = False, **fields) -> Path:
    """What `accelerate config` writes after its questions (ClusterConfig's own writer)."""
    from accelerate.commands.config.config_args import ClusterConfig

    settings = {"mixed_precision": "no", "use_cpu": False, "debug": False, **fields}
    config = ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type=distributed_type, **settings)
    config.to_json_file(path) if as_json else config.to_yaml_file(path)
    return path


FOOTPRINT = 8_482_560_409  # 7.90 GB: what the stand-in libproc below reports by default in tests

# The counters' places in <sys/resource.h>'s struct rusage_info_v4 (a 16-byte uuid, then 35
# uint64 counters): resident size 6, phys footprint 7, logical writes 27, lifetime max phys
# footprint 28, instructions 29. Counter i holds (i + 1) MiB; the lifetime maximum holds the
# value of STANDIN_FOOTPRINT (bytes), read at each call. Unknown pids: -1 and ESRCH.
STANDIN_LIBPROC = r"""
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int proc_pid_rusage(int pid, int flavor, void *buffer) {
    if (flavor != 4) { errno = EINVAL; return -1; }
    if (kill(pid, 0) != 0 && errno == ESRCH) return -1;
    memset(buffer, 0xab, 16);
    uint64_t *counters = (uint64_t *)((char *)buffer + 16);
    for (int i = 0; i < 35; i++) counters[i] = (uint64_t)(i + 1) << 20;
    const char *footprint = getenv("STANDIN_FOOTPRINT");
    counters[28] = footprint ? strtoull(footprint, NULL, 10) : 0;
    return 0;
}
"""


def build_standin_libproc(folder) -> str:
    """A stand-in for macOS's libproc, compiled with the C compiler into `folder`; its path."""
    source, library = folder / "libproc.c", folder / "libproc.so"
    source.write_text(STANDIN_LIBPROC)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return str(library)


# A real SLURM for the tests marked `slurm`: two nodes on this host (tests/slurm/local_slurm.sh).

LOCAL_SLURM = REPO / "tests" / "slurm" / "local_slurm.sh"
REQUIRE_SLURM = "MPSLAUNCH_REQUIRE_SLURM"  # set to 1 (by .ci/run): a skipped slurm test fails
SLURM_JOB_NOT_ENDED = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")


# The job's variables SLURM sets everywhere in a job; a step, a batch script and salloc differ
# (measured on the local SLURM, slurm 22.05).
SLURM_JOB = {
    "SLURM_CLUSTER_NAME": "mpslaunch", "SLURM_JOB_ID": "31", "SLURM_JOBID": "31",
    "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_NODELIST": "node[01-02]", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2", "SLURM_JOB_PARTITION": "local", "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
    "SLURM_SUBMIT_DIR": "/tmp/slm", "SLURM_SUBMIT_HOST": "vm", "PATH": "/usr/bin:/bin",
}


def slurm_task(procid: int, nodeid: int, localid: int, node: str, **step: str) -> dict[str, str]:
    """A task of `srun -N2 --ntasks-per-node=2` (the defaults), as SLURM set its environment."""
    return {**SLURM_JOB, "SLURM_JOB_NAME": "python", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
            "SLURM_STEP_NODELIST": "node[01-02]", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS": "4", "SLURM_NPROCS": "4",
            "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS_PER_NODE": "2", "SLURM_PROCID": str(procid),
            "SLURM_NODEID": str(nodeid), "SLURM_LOCALID": str(localid), "SLURM_GTIDS": str(procid),
            "SLURMD_NODENAME": node, "SLURM_TOPOLOGY_ADDR": node, **step}


def slurm_step_of(rank: int, per_node: int, nodes: tuple[str, ...] = ("node01", "node02"),
                  node_list: str = "node[01-02]", **extra: str) -> dict[str, str]:
    """Task `rank` of `srun -N{len(nodes)} --ntasks-per-node={per_node}`: SLURM places the tasks
    in blocks, the first node holding ranks 0 to per_node - 1 (measured)."""
    count = len(nodes) * per_node
    step = {"SLURM_STEP_NODELIST": node_list, "SLURM_STEP_NUM_NODES": str(len(nodes)),
            "SLURM_STEP_NUM_TASKS": str(count), "SLURM_NTASKS": str(count),
            "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{len(nodes)})" if len(nodes) > 1 else str(per_node),
            "SLURM_NTASKS_PER_NODE": str(per_node)}
    return slurm_task(rank, rank // per_node, rank % per_node, nodes[rank // per_node],
                      **{**step, **extra})


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    """The local SLURM: its clients' config, and SLURM's commands run with it."""

    conf: str  # what SLURM_CONF says to srun, sbatch, scancel, squeue and scontrol

    def environ(self, **extra: str) -> dict[str, str]:
        """The test's environment for a SLURM client; srun and sbatch pass it to the job."""
        return {**os.environ, **extra, "SLURM_CONF": self.conf}

    def run(self, *command: str, timeout: float = 60, env: dict | None = None,
            **kwargs) -> subprocess.CompletedProcess:
        """`srun ...`, `sbatch ...`, `scancel ...`: a SLURM client, with a timeout."""
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=self.environ(**(env or {})), stdin=subprocess.DEVNULL, **kwargs)

    def sbatch(self, *arguments: str, **kwargs) -> str:
        """The id of the batch job `sbatch ARGUMENTS` submitted."""
        submitted = self.run("sbatch", "--parsable", *arguments, **kwargs)
        assert submitted.returncode == 0, submitted.stderr
        return submitted.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """What `scontrol show job` says of the job (its JobState, ExitCode, ...)."""
        shown = self.run("scontrol", "show", "job", "--oneliner", job_id, timeout=10)
        return dict(field.split("=", 1) for field in shown.stdout.split() if "=" in field)

    def wait_for_end(self, job_id: str, seconds: float = 60) -> dict[str, str]:
        """The job's fields once it has ended (COMPLETED, FAILED, CANCELLED, ...)."""
        def ended() -> dict[str, str] | None:
            fields = self.job(job_id)
            return fields if fields and fields.get("JobState") not in SLURM_JOB_NOT_ENDED else None

        fields = wait_for(ended, seconds)
        assert fields, f"job {job_id} still {self.job(job_id).get('JobState')} after {seconds} s"
        return fields


def local_slurm(command: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([str(LOCAL_SLURM), command], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def slurm_conf(answer: subprocess.CompletedProcess) -> str:
    """The SLURM_CONF that local_slurm.sh's one line names."""
    return answer.stdout.rsplit("export SLURM_CONF=", 1)[1].strip()


def why_slurm_cannot_start() -> str | None:
    if sys.platform != "linux":
        return "the local SLURM runs on Linux only"
    if os.geteuid() != 0:
        return f"no local SLURM runs, and starting one needs root: `sudo {LOCAL_SLURM.relative_to(REPO)} start`"
    if not all(map(shutil.which, ("slurmctld", "slurmd", "srun", "munged"))):
        return f"SLURM is not installed: `{LOCAL_SLURM.relative_to(REPO)} start` installs it (apt-get) and starts it"
    return None
