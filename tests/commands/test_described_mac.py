"""The CLI on a described Mac: the launcher's platform probe is told it runs macOS (os.uname and
sysctl's answers), everything else is real: the torch check runs in a real child (this torch
has no mps, as no Linux wheel has), the verdict goes to a real cache file, the script really runs.
Linux itself: nothing is asked and nothing is kept."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys

import pytest

from helpers import run_cli, write_script
from mpslaunch.machine import torch_check
from mpslaunch.machine import probe
from mpslaunch.plan.known_faults import warnings_for

pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="needs a torch without mps, as on Linux"),
              pytest.mark.slow]

# Runs the CLI with the platform facts of a Mac; argv[1] is sysctl's answers as JSON.
ON_A_MAC = """
import json, os, sys
from mpslaunch import commands as cli
from mpslaunch.machine import facts as machine
sysctls = json.loads(sys.argv[1])
os.uname = lambda: os.uname_result(("Darwin", "mac", "25.3.0", "", "arm64"))
machine._mac_sysctls = lambda: sysctls
sys.exit(cli.main(sys.argv[2:]))
"""
BUILD = "25D125"


def on_a_mac(*args: str, vm: bool = False) -> subprocess.CompletedProcess:
    sysctls = {"kern.osproductversion": "26.3", "kern.osversion": BUILD,
               "machdep.cpu.brand_string": "Apple M2 Max", "kern.hv_vmm_present": "1" if vm else "0"}
    return subprocess.run([sys.executable, "-c", ON_A_MAC, json.dumps(sysctls), *args],
                          capture_output=True, text=True, timeout=180, env=os.environ.copy())


def cache_file(folder):
    return folder / torch_check.CACHE_FILE


def read_kept(folder) -> dict:
    return marshal.loads(cache_file(folder).read_bytes())


def write_kept(folder, entries: dict) -> None:
    cache_file(folder).write_bytes(marshal.dumps(entries))


def keep(folder, answer: torch_check.MpsAnswer) -> None:
    key = torch_check.cache_key(sys.executable, probe().torch_version, BUILD)
    write_kept(folder, {key: answer._asdict()})


def test_the_first_launch_asks_torch_later_ones_read_the_kept_answer(tmp_path, isolated_cache_dir):
    script = write_script(tmp_path, "train.py", "print('ran')\n")
    cache_file(isolated_cache_dir).write_bytes(marshal.dumps({"half a cache": 1})[:-3])  # damaged: ignored, rewritten
    first = on_a_mac("launch", "--dry-run", str(script))
    assert first.returncode == 0, first.stderr
    assert "checking once that torch can use mps" in first.stderr
    assert "device:          cpu" in first.stdout
    assert "reason:          cpu: torch " in first.stdout and "cannot use mps on this Mac: this torch build has no mps (checked " in first.stdout
    assert "mps check:       not usable: this torch build has no mps (checked " in first.stdout
    kept = read_kept(isolated_cache_dir)
    assert [key.endswith(f"| build {BUILD}") and key.startswith(sys.executable) for key in kept] == [True]

    second = on_a_mac("launch", "--dry-run", str(script))
    assert "checking" not in second.stderr and second.stdout == first.stdout

    (entry,) = kept.values()
    write_kept(isolated_cache_dir, {key: {**entry, "detail": "what the cache says"} for key in kept})
    third = on_a_mac("launch", "--dry-run", str(script))
    assert "cannot use mps on this Mac: what the cache says" in third.stdout


def test_device_mps_is_refused_with_torchs_reason(tmp_path, isolated_cache_dir):
    script = write_script(tmp_path, "train.py", "print('ran')\n")
    keep(isolated_cache_dir, torch_check.MpsAnswer(
        False, "torch.backends.mps.is_available() is False (RuntimeError: The MPS backend is "
        "supported on macOS 14.0+)", "update torch (pip install -U torch)", "2026-03-19 14:02"))
    refused = on_a_mac("launch", "--device", "mps", str(script))
    assert refused.returncode == 2 and refused.stdout == "" and "Traceback" not in refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("mpslaunch: error: --device mps asks for mps, but torch ")
    assert "supported on macOS 14.0+)" in line and "(checked 2026-03-19 14:02)" in line
    assert "pip install -U torch" in line


def test_a_virtual_machine_plans_cpu_and_runs_mps_with_one_warning(tmp_path, isolated_cache_dir):
    script = write_script(tmp_path, "train.py", "import os; print(os.environ['MPSLAUNCH_DEVICE'])\n")
    planned = on_a_mac("launch", "--dry-run", str(script), vm=True)
    assert "device:          cpu" in planned.stdout and "this Mac is a virtual machine" in planned.stdout
    assert "checking" not in planned.stderr  # a cpu plan needs no verdict
    assert "mps check:       not asked" in planned.stdout

    keep(isolated_cache_dir, torch_check.MpsAnswer(True, "works", "", "2026-03-19 14:02"))
    ran = on_a_mac("launch", "--device", "mps", "--no_keep_awake", str(script), vm=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "mps\n"
    *warnings, summary, end = ran.stderr.strip().splitlines()
    assert end.startswith("mpslaunch: ended after ")
    assert warnings[0].startswith("mpslaunch: warning: mps in a macOS virtual machine is known to fail")
    # Then the known faults of its chip with this torch (an M1 or M2 with torch 2.7 to 2.13).
    known = warnings_for(probe().torch_version, "Apple M2 Max", (26, 3), "no", "mps",
                         probe().accelerate_version)
    assert [line.removeprefix("mpslaunch: warning: ") for line in warnings[1:]] == list(known)
    assert summary.startswith("mpslaunch: mps: Apple M2 Max, macOS 26.3")


def test_env_asks_again_and_replaces_the_kept_answer(isolated_cache_dir):
    keep(isolated_cache_dir, torch_check.MpsAnswer(True, "works", "", "2000-01-01 00:00"))
    report = on_a_mac("env", "--json")
    assert report.returncode == 0, report.stderr
    facts = json.loads(report.stdout)
    assert (facts["macos"], facts["macos_build"], facts["virtual_machine"]) == ("26.3", BUILD, False)
    assert facts["mps_verdict"].startswith("not usable: this torch build has no mps (checked ")
    assert "2000-01-01" not in facts["mps_verdict"]
    assert facts["launcher_choice"].startswith("cpu: torch ")
    (entry,) = read_kept(isolated_cache_dir).values()
    assert entry["usable"] is False and entry["checked_at"] != "2000-01-01 00:00"


def test_config_show_plans_as_launch_does_with_torchs_answer(isolated_cache_dir):
    """`config show` goes through launch's own preparation: on a Mac where torch was never asked,
    it asks (and keeps the answer), so it says cpu with torch's reason, as launch would plan."""
    shown = on_a_mac("config", "show")
    assert shown.returncode == 0, shown.stderr
    line = shown.stdout.strip().splitlines()[-1]
    assert line.startswith("on this machine: device auto -> cpu: torch "), line
    assert "cannot use mps on this Mac: this torch build has no mps" in line
    assert cache_file(isolated_cache_dir).exists()


def test_the_python_api_plans_with_torchs_answer_too(tmp_path):
    script = write_script(tmp_path, "train.py", "import os; print(os.environ['MPSLAUNCH_DEVICE'])\n")
    code = ON_A_MAC.replace("sys.exit(cli.main(sys.argv[2:]))",
                            "import mpslaunch; sys.exit(mpslaunch.launch(sys.argv[2], quiet=True))")
    sysctls = {"kern.osproductversion": "15.5", "kern.osversion": "24F74",
               "machdep.cpu.brand_string": "Apple M4", "kern.hv_vmm_present": "0"}
    ran = subprocess.run([sys.executable, "-c", code, json.dumps(sysctls), str(script)],
                         capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "cpu\n"  # torch here has no mps: the plan follows torch, not the platform


def test_on_linux_nothing_is_asked_or_kept(tmp_path, isolated_cache_dir):
    script = write_script(tmp_path, "train.py", "print('ran')\n")
    planned = run_cli("launch", "--dry-run", str(script))
    assert planned.returncode == 0 and "mps check" not in planned.stdout and planned.stderr == ""
    assert run_cli("env").returncode == 0
    # no mps verdict; only the findings of the check launch ran on the script (mpslaunch check)
    assert [path.name for path in isolated_cache_dir.iterdir()] == ["script-checks"]


# The harness on a Mac whose torch and Accelerate are older than this machine's.
WITH_OLD_VERSIONS = """
from mpslaunch.machine import facts
facts._torch_build_facts = lambda: {"__version__": "2.12.1"}
facts._accelerate_version = lambda: "1.10.1"
""" + ON_A_MAC


def test_the_dry_run_and_the_launch_name_the_known_faults_of_this_torch_and_accelerate(
        tmp_path, isolated_cache_dir):
    key = torch_check.cache_key(sys.executable, "2.12.1", BUILD)
    write_kept(isolated_cache_dir,
               {key: torch_check.MpsAnswer(True, "works", "", "2026-03-19 14:02")._asdict()})
    script = write_script(tmp_path, "train.py", "print('ran')\n")
    sysctls = {"kern.osproductversion": "15.5", "kern.osversion": BUILD,
               "machdep.cpu.brand_string": "Apple M2 Max", "kern.hv_vmm_present": "0"}

    def described(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", WITH_OLD_VERSIONS, json.dumps(sysctls), *args],
                              capture_output=True, text=True, timeout=180, env=os.environ.copy())

    planned = described("launch", "--dry-run", "--mixed_precision", "fp16", str(script))
    assert planned.returncode == 0, planned.stderr
    warnings = [line for line in planned.stdout.splitlines() if line.startswith("warning: ")]
    assert [line.split(": ")[1] for line in warnings[:3]] == [
        "fp16 on mps with torch 2.12.1", "on an M1 or M2 GPU with torch 2.12.1, matrix products "
        "over a reduction dimension of 32,767 or more (a language model's output layer, say) "
        "can be silently wrong by 10-30% (pytorch/pytorch#193487, #177116, fixed for 2-D "
        "products in torch 2.14); upgrade torch to 2.14 or later",
        "fp16 on mps with Accelerate 1.10.1"]
    ran = described("launch", "--mixed_precision", "fp16", "--no_keep_awake", str(script))
    assert ran.returncode == 0 and ran.stdout == "ran\n", ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert [line[len("mpslaunch: warning: "):] for line in lines[:3]] == [
        line[len("warning: "):] for line in warnings[:3]]
    assert lines[3].startswith("mpslaunch: mps: Apple M2 Max") and lines[-1].startswith(
        "mpslaunch: ended after ")


# Files a user's folder may hold that shadow the standard library or torch itself; each records
# that it was imported, then fails as a broken module would.
SHADOWING = {name: f"open({name!r} + '.imported', 'w').close()\nraise ImportError('{name} of the user')\n"
             for name in ("random.py", "json.py", "torch.py")}


def a_folder_with_shadowing_modules(folder):
    for name, body in SHADOWING.items():
        write_script(folder, name, body)
    return write_script(folder, "train.py", "print('ran')\n")


def test_the_mps_check_never_imports_from_the_users_folder(tmp_path, isolated_cache_dir):
    """The launcher runs as the `mpslaunch` command does (-P: its own folder is not on its path);
    the check's child runs in a folder of its own, so torch's verdict is torch's."""
    script = a_folder_with_shadowing_modules(tmp_path)
    sysctls = {"kern.osproductversion": "26.3", "kern.osversion": BUILD,
               "machdep.cpu.brand_string": "Apple M2 Max", "kern.hv_vmm_present": "0"}
    first = subprocess.run([sys.executable, "-P", "-c", ON_A_MAC, json.dumps(sysctls), "launch",
                            "--dry-run", script.name], capture_output=True, text=True,
                           timeout=180, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "cannot use mps on this Mac: this torch build has no mps (checked " in first.stdout
    assert sorted(path.name for path in tmp_path.glob("*.imported")) == []
    (entry,) = read_kept(isolated_cache_dir).values()
    assert entry["detail"] == "this torch build has no mps"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="-P (the command's own path) needs Python 3.11")
def test_env_never_runs_a_torch_py_in_the_users_folder(tmp_path):
    a_folder_with_shadowing_modules(tmp_path)
    report = run_cli("env", "--json", cwd=tmp_path, python_options=("-P",))
    assert report.returncode == 0, report.stderr
    facts = json.loads(report.stdout)
    assert sorted(path.name for path in tmp_path.glob("*.imported")) == []
    assert facts["torch"].startswith(probe().torch_version) and facts["mps"] == "not built"


def a_broken_torch(folder):
    """An installed torch whose import fails: its version file reads, its __init__ raises."""
    package = folder / "torch"
    package.mkdir(parents=True)
    (package / "version.py").write_text(f"__version__ = '{probe().torch_version}'\n")
    (package / "__init__.py").write_text("raise ImportError('a half-installed torch')\n")
    return folder


def test_a_check_that_cannot_import_torch_is_said_and_never_kept(tmp_path, isolated_cache_dir):
    script = write_script(tmp_path, "train.py", "print('ran')\n")
    site = a_broken_torch(tmp_path / "site")
    broken = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    sysctls = {"kern.osproductversion": "26.3", "kern.osversion": BUILD,
               "machdep.cpu.brand_string": "Apple M2 Max", "kern.hv_vmm_present": "0"}
    first = subprocess.run([sys.executable, "-c", ON_A_MAC, json.dumps(sysctls), "launch",
                            "--dry-run", str(script)], capture_output=True, text=True,
                           timeout=180, env=broken)
    assert first.returncode == 0, first.stderr
    assert "torch cannot be imported (ImportError: a half-installed torch)" in first.stdout
    assert "nothing was kept, the next launch asks again" in first.stdout
    assert not cache_file(isolated_cache_dir).exists()

    again = on_a_mac("launch", "--dry-run", str(script))  # torch as installed: asked, and kept
    assert "checking once that torch can use mps" in again.stderr
    assert "cannot use mps on this Mac: this torch build has no mps (checked " in again.stdout
    (entry,) = read_kept(isolated_cache_dir).values()
    assert entry["detail"] == "this torch build has no mps"
