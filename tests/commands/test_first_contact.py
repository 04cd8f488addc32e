"""A newcomer's first hour: the habits of other launchers (torchrun's `torchrun train.py`), a typo
in a command, the launcher's options given after the script, a hand-written profile in YAML's
own words, and an import over a profile that is already there."""

from __future__ import annotations

import pytest

from conftest import one_line_error, run_cli, write_script


@pytest.mark.parametrize("args, suggested", [
    (["train.py"], "`mpslaunch launch train.py`"),
    (["train.py", "--epochs", "3"], "`mpslaunch launch train.py --epochs 3`"),
    (["--cpu", "train.py"], "`mpslaunch launch --cpu train.py`"),
    (["lauch", "train.py"], "`mpslaunch launch train.py`"),
    (["chek", "train.py"], "`mpslaunch check train.py`"),
    (["conifg"], "`mpslaunch config`"),
])
def test_a_script_or_a_typo_in_place_of_the_command_suggests_the_command(tmp_path, args, suggested):
    write_script(tmp_path, "train.py", "print('trained')\n")
    line = one_line_error(run_cli(*args, cwd=tmp_path))
    assert f"did you mean {suggested}?" in line, line
    assert "invalid choice" not in line


def test_an_unknown_command_names_the_commands(tmp_path):
    line = one_line_error(run_cli("frobnicate", cwd=tmp_path))
    assert "unknown command 'frobnicate'" in line and "launch" in line and "config" in line, line
