"""torchrun_attempts: a line for each restart, from what torch's agent does and logs."""

from __future__ import annotations

import logging

from mpslaunch.run.torch_internals import FAILURE_LOGGER, failures_logged
from mpslaunch.run.torchrun.attempts import Attempts


def envs(attempt: int, first_rank: int) -> dict[int, dict[str, str]]:
    return {local: {"RANK": str(first_rank + local), "TORCHELASTIC_RESTART_COUNT": str(attempt)}
            for local in range(2)}


def torchs_failure_record(exitcode: int, local_rank: int) -> None:
    # As torch.distributed.elastic.multiprocessing.api logs the failure that ends an attempt.
    logging.getLogger(FAILURE_LOGGER).error(
        "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s", exitcode, local_rank, 4242,
        "python")


def test_each_restart_names_the_failed_rank_and_the_count():
    said = []
    attempts = Attempts(max_restarts=2, announce=said.append)
    with failures_logged(attempts.failed):
        attempts.started(envs(0, first_rank=2))
        torchs_failure_record(7, local_rank=1)
        attempts.started(envs(1, first_rank=2))
        torchs_failure_record(-6, local_rank=0)
        attempts.started(envs(2, first_rank=2))
    assert said == [
        "mpslaunch: rank 3 exited with code 7; starting every rank again (restart 1 of 2)",
        "mpslaunch: rank 2 was killed by SIGABRT (exit code 134); starting every rank again "
        "(restart 2 of 2)"]
    assert attempts.counted() == "2 restarts of --max_restarts 2"


def test_without_a_restart_nothing_is_said_and_nothing_counted():
    said = []
    attempts = Attempts(max_restarts=1, announce=said.append)
    attempts.started(envs(0, first_rank=0))
    assert said == [] and attempts.counted() == ""


def test_a_failure_record_worded_otherwise_still_gives_the_restart_line():
    said = []
    attempts = Attempts(max_restarts=1, announce=said.append)
    with failures_logged(attempts.failed):
        attempts.started(envs(0, first_rank=0))
        logging.getLogger(FAILURE_LOGGER).error("worker %s died", 1)
        attempts.started(envs(1, first_rank=0))
    assert said == ["mpslaunch: a rank failed; starting every rank again (restart 1 of 1)"]
