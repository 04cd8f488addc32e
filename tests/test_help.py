"""`--help` is written for the person typing the command: what it does, options, examples."""

from __future__ import annotations

import importlib

import pytest

from mpslaunch import cli


def help_text(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_lists_each_command_and_where_to_read_more(capsys):
    text = help_text(capsys)
    for name, (_, summary) in cli.COMMANDS.items():
        assert f"{name}    " in text and summary in text
    assert "mpslaunch COMMAND --help" in text


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_each_command_help_ends_with_examples_and_shows_no_maintainer_notes(capsys, command):
    text = help_text(capsys, command)
    examples = text.split("\nexamples:\n")[1].splitlines()
    assert examples and all(line.startswith(f"  mpslaunch {command}") for line in examples)
    docstring = importlib.import_module(cli.COMMANDS[command][0]).__doc__
    assert docstring.splitlines()[0] not in text
