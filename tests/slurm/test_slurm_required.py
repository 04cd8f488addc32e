"""Where SLURM must run (MPSLAUNCH_REQUIRE_SLURM=1, as .ci/run sets it), a slurm test that skips
fails, saying why it skipped; elsewhere it skips. Other tests skip as usual in both."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import REPO, REQUIRE_SLURM, write_script

pytestmark = pytest.mark.slow  # every test here starts processes

SKIPPING = """
import pytest

@pytest.fixture
def cluster():
    pytest.skip("no cluster here")

@pytest.mark.slurm
def test_skips_in_its_fixture(cluster):
    pass

@pytest.mark.slurm
def test_skips_in_its_body():
    pytest.skip("no scontrol here")

def test_not_about_slurm():
    pytest.skip("not about SLURM")
"""


@pytest.mark.parametrize("required", [True, False])
def test_a_skipped_slurm_test_fails_only_where_slurm_is_required(tmp_path, required):
    test_file = write_script(tmp_path, "test_skipping.py", SKIPPING)
    env = {name: value for name, value in os.environ.items() if name != REQUIRE_SLURM}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))
    if required:
        env[REQUIRE_SLURM] = "1"
    # The suite's conftest as a plugin, with the project's settings (its `slurm` marker).
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                          "-c", str(REPO / "pyproject.toml"), "-rfs", str(test_file)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    summary = ran.stdout.strip().splitlines()[-1]
    if required:
        # A skip in a fixture fails as an error at setup, one in the test's body as a failure.
        assert ran.returncode == 1 and "1 failed, 1 skipped, 1 error" in summary, ran.stdout
        assert f"{REQUIRE_SLURM}=1 and this slurm test skipped: no cluster here" in ran.stdout
        assert f"{REQUIRE_SLURM}=1 and this slurm test skipped: no scontrol here" in ran.stdout
    else:
        assert ran.returncode == 0 and "3 skipped" in summary, ran.stdout
