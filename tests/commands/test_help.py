"""`--help` is written for the person typing the command: what it does, options, examples."""

from __future__ import annotations

import importlib

import pytest

from mpslaunch import commands as cli


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


def test_launch_help_shows_one_spelling_per_option_a_one_line_usage_and_defaults(capsys):
    text = help_text(capsys, "launch")
    assert text.splitlines()[0] == "usage: mpslaunch launch [options] [script] ..."
    assert text.splitlines()[1] == ""
    assert "--mixed_precision {no,fp16,bf16}" in text and "--mixed-precision" not in text
    assert "--num-processes" not in text and "--dry-run" not in text
    assert "(default: no)" in text and "(default: 30)" in text and "(default: static)" in text
    for title in ("what to run on:", "several machines", "for the script's Accelerator", "output and profile:"):
        assert title in text


def test_the_dash_spelling_is_still_taken(capsys):
    parser = cli.build_parser("launch")
    args = parser.parse_args(["launch", "--mixed-precision", "bf16", "--num-processes", "2", "t.py"])
    assert (args.mixed_precision, args.num_processes) == ("bf16", 2)
