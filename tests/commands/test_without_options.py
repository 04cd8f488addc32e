"""`mpslaunch launch SCRIPT [ARGS...]` with no launch option is read without a parser (argparse
is not even imported): what it reads is what the parser reads, for any script and arguments."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from helpers import write_script
from mpslaunch import commands as cli
from mpslaunch.commands import launch

# Words a script's arguments hold, among them launch's own options, Accelerate's, -h and --
SCRIPT_WORDS = st.one_of(
    st.sampled_from(["-h", "--help", "--version", "--cpu", "--num_processes", "2", "--", "-m",
                     "--dry_run", "-q", "--tpu", "--num_processes=2", "-", "train.py", "-1"]),
    st.text(max_size=8),
)


def parsed(words: list[str]) -> dict:
    args, unknown = cli.build_parser("launch").parse_known_args(["launch", *words])
    assert unknown == []
    return vars(args)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=10).filter(lambda word: not word.startswith("-")),
       st.lists(SCRIPT_WORDS, max_size=6))
def test_a_script_and_its_arguments_read_without_the_parser_are_what_the_parser_reads(script, rest):
    plain = launch.without_options([script, *rest])
    assert plain is None if "--" in rest else vars(plain) == parsed([script, *rest])


@pytest.mark.parametrize("words", [[], ["--cpu", "train.py"], ["-m", "tool"], ["-q", "x.py"],
                                   ["--", "train.py"], ["-1"], ["train.py", "--"],
                                   ["train.py", "a", "--", "b"]])
def test_an_option_or_no_script_is_left_to_the_parser(words):
    assert launch.without_options(words) is None


def test_every_launch_option_is_at_the_parsers_default():
    plain = vars(launch.without_options(["train.py", "--epochs", "3"]))
    assert plain == parsed(["train.py", "--epochs", "3"])
    assert plain["script_args"] == ["--epochs", "3"] and plain["handler"] is launch.main


@pytest.mark.slow
def test_a_launch_with_no_option_runs_without_importing_argparse(tmp_path):
    script = write_script(tmp_path, "train.py", "import sys; print('ran', sys.argv[1:])\n")
    probe = ("import sys; from mpslaunch.commands import main; "
             f"code = main(['launch', {str(script)!r}, '--epochs', '3']); "
             "print(code, 'argparse' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-2:] == ["ran ['--epochs', '3']", "0 False"], done.stderr
