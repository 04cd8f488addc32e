"""What a script finds in os.environ on the plan: the launcher's own variables, as the plan
decides them (plan.seen_by_the_script): on one process another launcher's variables are removed
(`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, ...), on several torchrun sets its own, and
`MPSLAUNCH_DEVICE` is the plan's device. Anything else is the user's and unknown.

A variable the script sets itself (`os.environ["RANK"] = ...`) is unknown too, except in the
tests of the if/elif chain whose branches set it: a chain's tests run before any of its branches
(`if "RANK" in os.environ: ... elif "SLURM_PROCID" in os.environ: os.environ["RANK"] = ...`).
`os.environ.update(...)` and the like make every one unknown.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from mpslaunch.check.reading import statements
from mpslaunch.check.selection import sets_a_variable

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from mpslaunch.plan import Seen


class Environment:
    """The variables the plan decides, less those the project's files set."""

    def __init__(self, device: str, processes: int, files: Iterable):
        self.device, self.processes = device, processes
        # name -> for each place that sets it, the tests that run before it can: (file, first, last)
        self.settings = _settings(files)  # None: any variable may be set

    def seen(self, name: object, place: tuple[str, int]) -> Seen | None:
        """What the script finds in os.environ[name] when it reads it at `place` (file, line);
        None when the plan does not decide it."""
        if not isinstance(name, str) or self.settings is None:
            return None
        file, line = place
        if any(
            not any(test_file == file and first <= line <= last for test_file, first, last in tests)
            for tests in self.settings.get(name, ())
        ):
            return None  # the script may have set it by then
        from mpslaunch.plan import seen_by_the_script  # only for a script that reads one

        return seen_by_the_script(name, self.device, self.processes)


def _settings(files: Iterable) -> dict[str, list[list[tuple[str, int, int]]]] | None:
    """Each variable a file sets, with the tests that run before each setting (None: a file may
    set any variable)."""
    found: dict[str, list[list[tuple[str, int, int]]]] = {}
    for facts in files:
        source = facts.source
        if not source.lines.variables:
            continue
        texts = source.words.split("\n")
        sets_one, sets_any = sets_a_variable()
        for line in source.lines.variables:
            if sets_any.search(texts[line - 1]):
                return None
            for match in sets_one.finditer(texts[line - 1]):
                found.setdefault(next(filter(None, match.groups())), []).append(
                    [(str(source.path), *span) for span in _tests_before(source.tree, line)]
                )
    return found


def _tests_before(tree: ast.Module, line: int) -> list[tuple[int, int]]:
    """The lines of the tests of each if/elif chain whose branch holds `line`: they run before it."""
    spans = []
    for statement in statements(tree.body, [line]):
        if not isinstance(statement, ast.If):
            continue
        if (
            not statement.test.lineno
            <= line
            <= (statement.test.end_lineno or statement.test.lineno)
        ):
            link = statement
            while True:
                spans.append((link.test.lineno, link.test.end_lineno or link.test.lineno))
                if len(link.orelse) != 1 or not isinstance(link.orelse[0], ast.If):
                    break
                link = link.orelse[0]
    return spans
