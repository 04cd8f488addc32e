"""The README's two set-up commands are what CI runs, word for word (.ci/run, the workflow)."""

from __future__ import annotations

import re

from helpers import REPO


def setup_commands() -> list[str]:
    section = (REPO / "README.md").read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.+?)\n```", section)[:2]


def test_the_readme_starts_with_two_one_line_setup_commands():
    main_job, tests = setup_commands()
    assert "examples/cv_example.py" in main_job and "make_demo_images.py" in main_job
    assert "pytest" in tests


def test_ci_runs_both_commands_word_for_word_main_job_first():
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    main_job, tests = setup_commands()
    assert lines.index(main_job) < lines.index(tests)


def test_the_workflow_runs_the_readme_test_command():
    workflow = (REPO / ".github" / "workflows" / "ci.yml").read_text()
    assert f"run: {setup_commands()[1]}" in workflow
