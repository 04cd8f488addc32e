"""What a script finds in os.environ on the plan: the launcher's own variables, as the plan
decides them (plan.seen_by_the_script): on one process another launcher's variables are removed
(`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, ...), on several torchrun sets its own, and
`MPSLAUNCH_DEVICE` is the plan's device. Anything else is the user's and unknown.

A variable the script sets itself (`os.environ["RANK"] = ...`) is unknown too, except where the
setting sits in a branch of the if/elif chain that tests that variable: there the test reads the
variable before the script sets it. `os.environ.update(...)` and the like make every one unknown.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from mpslaunch.check.reading import statements
from mpslaunch.check.selection import SETS_ANY_VARIABLE as _SET_ANY
from mpslaunch.check.selection import SETS_VARIABLE as _SET

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from mpslaunch.plan import Seen


class Environment:
    """The variables the plan decides, less those the project's files set."""

    def __init__(self, device: str, processes: int, files: Iterable):
        self.device, self.processes = device, processes
        self.set_by_script = _set_by_script(files)  # None: any variable may be set

    def seen(self, name: object) -> Seen | None:
        """What the script finds in os.environ[name]; None when the plan does not decide it."""
        if not isinstance(name, str) or self.set_by_script is None or name in self.set_by_script:
            return None
        from mpslaunch.plan import seen_by_the_script  # only for a script that reads one

        return seen_by_the_script(name, self.device, self.processes)


def _set_by_script(files: Iterable) -> frozenset[str] | None:
    """The variables some file sets where a test of it has not come first; None for all."""
    names: set[str] = set()
    for facts in files:
        source = facts.source
        if not source.lines.variables:
            continue
        texts = source.words.split("\n")
        for line in source.lines.variables:
            if _SET_ANY.search(texts[line - 1]):
                return None
            for match in _SET.finditer(texts[line - 1]):
                name = next(filter(None, match.groups()))
                if not _tested_first(source.tree, line, name):
                    names.add(name)
    return frozenset(names)


def _tested_first(tree: ast.Module, line: int, name: str) -> bool:
    """Whether the setting on `line` sits in a branch of an if statement whose test names the
    variable: the test reads it first."""
    for statement in statements(tree.body, [line]):
        if isinstance(statement, ast.If) and not statement.test.lineno <= line <= statement.test.end_lineno \
                and any(isinstance(node, ast.Constant) and node.value == name for node in ast.walk(statement.test)):
            return True
    return False
