"""Parsing: no abbreviations, the nearest known option for an unknown one, one line, exit 2."""

from __future__ import annotations

import pytest

from helpers import one_line_error, run_cli, write_script

pytestmark = pytest.mark.slow  # every test here starts processes


@pytest.mark.parametrize("typed, meant", [
    ("--num_proc", "--num_processes"),  # an abbreviation is not accepted, only suggested
    ("--mixed", "--mixed_precision"),  # never "ambiguous" between --mixed_precision and --mixed-precision
    ("--mixed-precison", "--mixed_precision"),
    ("--dryrun", "--dry_run"),
])
def test_abbreviations_and_typos_name_the_nearest_option(tmp_path, typed, meant):
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    message = one_line_error(run_cli("launch", typed, "bf16", str(script)))
    assert f"unrecognized arguments: {typed} (did you mean {meant}?)" in message
    assert message.endswith("(see `mpslaunch launch --help`)")
    assert "ambiguous" not in message
    assert not (tmp_path / "train.py.ran").exists()


def test_launch_without_a_script_says_how_to_give_one():
    message = one_line_error(run_cli("launch", "--cpu"))
    assert "no script given" in message and "script_args" not in message


def test_top_level_options_are_not_abbreviated_either():
    message = one_line_error(run_cli("--vers"))
    assert "(did you mean --version?)" in message
