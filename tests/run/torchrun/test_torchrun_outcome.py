"""torchrun_outcome: exit codes and the one-line failure summary."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from mpslaunch.run.torchrun.outcome import (RankFailure, failure_summary, from_torch, how_it_ended,
                                            largest_own_failure, other_endings, rank_log_folder,
                                            stopped_ranks, stopped_summary)


def make_logs(root, run_id: str, attempts: int, local_ranks: int = 2):
    run = root / f"{run_id}_abc123"
    for attempt in range(attempts):
        for local_rank in range(local_ranks):
            folder = run / f"attempt_{attempt}" / str(local_rank)
            folder.mkdir(parents=True)
            (folder / "stderr.log").write_text("Traceback ...\n")
            (folder / "stdout.log").write_text("")
    return run


def test_exit_code_and_signal_wording():
    assert how_it_ended(3) == "exited with code 3"
    assert how_it_ended(-signal.SIGKILL) == "was killed by SIGKILL (exit code 137)"
    assert how_it_ended(-signal.SIGSEGV) == "was killed by SIGSEGV (exit code 139)"
    assert how_it_ended(143) == "exited with code 143, as a script does that stops on SIGTERM"
    assert how_it_ended(130) == "exited with code 130, as a script does that stops on SIGINT"
    assert how_it_ended(137) == "exited with code 137"  # SIGKILL cannot be caught: no such stop


def test_a_rank_that_stopped_on_a_signal_is_not_called_failed():
    """complete_cv_example's ranks exit 143 after saving a checkpoint on SIGTERM."""
    text = failure_summary(RankFailure(0, 0, 1, 143, None))
    assert text.startswith("mpslaunch: rank 0 stopped first: it exited with code 143, as a "
                           "script does that stops on SIGTERM")
    assert "failed" not in text


def test_log_folder_is_the_latest_attempt(tmp_path):
    run = make_logs(tmp_path, "mpslaunch-1", attempts=12)  # attempt_11 sorts before attempt_2 as text
    assert rank_log_folder(str(tmp_path), "mpslaunch-1", 1) == run / "attempt_11" / "1"


def test_log_folder_of_another_run_is_not_used(tmp_path):
    make_logs(tmp_path, "mpslaunch-other", attempts=1)
    assert rank_log_folder(str(tmp_path), "mpslaunch-1", 0) is None


def test_summary_names_rank_code_and_stderr_file(tmp_path):
    run = make_logs(tmp_path, "r", attempts=1)
    torch_failure = SimpleNamespace(local_rank=1, pid=4242, exitcode=3, error_file="<N/A>")
    failure = from_torch(5, torch_failure, str(tmp_path), "r")
    assert failure == RankFailure(5, 1, 4242, 3, str(run / "attempt_0" / "1"))
    text = failure_summary(failure)
    assert text.startswith("mpslaunch: rank 5 failed first: it exited with code 3")
    assert str(run / "attempt_0" / "1" / "stderr.log") in text
    assert "error.json" not in text and "\n" not in text


def test_summary_mentions_torchs_error_record_when_the_script_wrote_one(tmp_path):
    run = make_logs(tmp_path, "r", attempts=1)
    (run / "attempt_0" / "0" / "error.json").write_text("{}")
    text = failure_summary(RankFailure(0, 0, 1, 1, str(run / "attempt_0" / "0")))
    assert "error.json" in text


def test_summary_without_log_files_still_names_the_rank():
    text = failure_summary(RankFailure(1, 1, 1, -9, None), {0: -signal.SIGTERM})
    assert text == ("mpslaunch: rank 1 failed first: it was killed by SIGKILL (exit code 137); "
                    "rank 0 was stopped")


def test_summary_names_each_other_rank_as_failed_stopped_or_exited():
    first = RankFailure(5, 1, 1, 3, None)  # machine 1 of 2, four ranks each: ranks 4 to 7
    failures = {5: first, 6: SimpleNamespace(exitcode=-signal.SIGTERM),
                4: SimpleNamespace(exitcode=7), 7: SimpleNamespace(exitcode=143)}
    others = other_endings(first, failures, local_ranks=4)
    assert others == {4: 7, 6: -signal.SIGTERM, 7: 143}
    assert failure_summary(first, others) == (
        "mpslaunch: rank 5 failed first: it exited with code 3; rank 4 also failed: it exited "
        "with code 7; ranks 6, 7 were stopped")
    others = other_endings(RankFailure(1, 1, 1, 3, None), {1: first}, local_ranks=2)
    assert failure_summary(first, others).endswith("; rank 0 exited with code 0")


@pytest.mark.parametrize("torch_reports_the_stopped", [True, False], ids=["torch 2.10+", "older torch"])
@pytest.mark.parametrize("stop_ended, words", [
    (-signal.SIGTERM, "rank 4 was stopped"),
    (-signal.SIGKILL, "rank 4 did not stop within --grace_period 2 s and was killed (SIGKILL)"),
    (5, "rank 4 also failed: it exited with code 5"),
])
def test_the_ranks_the_launcher_stopped_are_named_from_the_stop_on_every_torch(
        torch_reports_the_stopped, stop_ended, words):
    """Machine 1 of 2, two ranks each: rank 5 fails; rank 4, still running, is stopped. torch
    before 2.10 reports only rank 5 (described); the stop recorded how rank 4 ended."""
    first = RankFailure(5, 1, 1, 3, None)
    failures = {5: first, **({4: SimpleNamespace(exitcode=stop_ended)} if torch_reports_the_stopped else {})}
    stopped = {0: stop_ended}  # by local rank
    others = other_endings(first, failures, local_ranks=2, stopped=stopped)
    assert others == {4: stop_ended}
    summary = failure_summary(first, others, stopped_ranks(first, stopped), grace_seconds=2)
    assert summary == f"mpslaunch: rank 5 failed first: it exited with code 3; {words}"


def test_stopped_summary():
    assert "SIGTERM" in stopped_summary(signal.SIGTERM) and "143" in stopped_summary(signal.SIGTERM)
    assert os.linesep not in stopped_summary(signal.SIGINT)


def test_an_abort_in_torchs_exit_is_named_as_such(tmp_path):
    """SIGABRT whose stderr ends with std::terminate's line: torch's gloo shutdown at exit."""
    run = make_logs(tmp_path, "r", attempts=1)
    folder = run / "attempt_0" / "1"
    (folder / "stderr.log").write_text("all done\nterminate called without an active exception\n")
    text = failure_summary(RankFailure(1, 1, 1, -signal.SIGABRT, str(folder)), {0: 0})
    assert text.startswith(
        "mpslaunch: rank 1 failed first: it aborted in torch's exit after the script had returned "
        "(SIGABRT, exit code 134, \"terminate called without an active exception\"): a known torch "
        "problem with gloo, https://github.com/pytorch/pytorch/issues/190489;")
    # With PYTHONFAULTHANDLER on, the threads' stacks follow the line: still torch's exit.
    (folder / "stderr.log").write_text(
        "all done\nterminate called without an active exception\nFatal Python error: Aborted\n\n"
        "Thread 0x00007f0000000700 (most recent call first):\n  <no Python frame>\n")
    assert "aborted in torch's exit" in failure_summary(RankFailure(1, 1, 1, -signal.SIGABRT, str(folder)))
    (folder / "stderr.log").write_text("terminate called without an active exception\nmore\n")
    plain = failure_summary(RankFailure(1, 1, 1, -signal.SIGABRT, str(folder)), {0: 0})
    assert "it was killed by SIGABRT (exit code 134): a crash in native code;" in plain  # the script's own



def test_in_a_slurm_step_a_node_reports_its_largest_own_failure_not_one_it_stopped():
    """torch times failures in whole seconds: a rank that lost its failed peer within the same
    second can look first. srun reports its tasks' largest code, so each node reports the
    largest of its ranks' own codes; a rank the launcher stopped (local rank 0 here) does not
    count."""
    failures = {4: SimpleNamespace(local_rank=0, exitcode=-signal.SIGTERM),
                5: SimpleNamespace(local_rank=1, exitcode=1),
                6: SimpleNamespace(local_rank=2, exitcode=3)}
    assert largest_own_failure(failures, stopped={0: -signal.SIGTERM}) == 6
    assert largest_own_failure({5: failures[5]}, stopped={}) == 5
    killed = {5: SimpleNamespace(local_rank=1, exitcode=-signal.SIGKILL), 6: failures[6]}
    assert largest_own_failure(killed, stopped={}) == 5  # 137 by itself (out of memory)
    text = failure_summary(RankFailure(6, 2, 1, 3, None), largest=True)
    assert text.startswith("mpslaunch: rank 6 failed with the largest code: it exited with code 3")
