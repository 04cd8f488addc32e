"""The walk through a file: which calls can run on the plan, and where they sit.

Only statements on lines that mention what a rule looks for (selection.py) are walked into.
A branch that the plan rules out is not walked (`if torch.cuda.is_available():` on a Mac, `if
ddp:` with `ddp` read from RANK on one process); nor is what follows, in its block, a statement
that always stops there: an `assert` of such a test, an exit, a raise or a return, an
if/elif/else whose every branch the plan may take stops (`else: sys.exit(1)`). Functions
nothing names, and an imported module's main block, are left out.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import replace

from mpslaunch.check.scan import DEFINITION_NODES, FUNCTION_NODES, FileFacts, Project, Scope, Where
from mpslaunch.check.values import ENVIRON, UNKNOWN, read_at

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import TypeGuard


def walk_project(project: Project, rules) -> None:
    """Hand each call of the project's files that can run to rules.call, and each if and
    conditional expression to rules.branch, with their place."""
    for facts in project.facts:
        _Walker(facts, project, rules).run()


# ---------------------------------------------------------------- the main guard


def is_main_guard(node: ast.AST) -> TypeGuard[ast.If]:
    """`if __name__ == "__main__":` (either way round, or and-ed with more conditions)."""
    if not isinstance(node, ast.If):
        return False
    tests = (
        node.test.values
        if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And)
        else [node.test]
    )
    return any(_is_main_test(test) for test in tests)


def _is_main_test(test: ast.expr) -> bool:
    if not isinstance(test, ast.Compare):
        return False
    sides = [test.left, *test.comparators]
    return (
        len(sides) == 2
        and isinstance(test.ops[0], ast.Eq)
        and any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides)
        and any(isinstance(side, ast.Constant) and side.value == "__main__" for side in sides)
    )


def has_main_guard(tree: ast.Module) -> bool:
    return any(is_main_guard(statement) for statement in tree.body)


# ---------------------------------------------------------------- what runs at import


def runs_at_import(tree: ast.Module) -> set[str]:
    """Names of the script's module-level functions and classes that run when the script is
    run or imported again: named by module-level code outside the main block, and what those
    name in turn (a call, or a function handed to fire.Fire or a decorator)."""
    defined = {node.name: node for node in tree.body if isinstance(node, DEFINITION_NODES)}
    reached: set[str] = set()
    waiting = [name for name in _module_level_names(tree.body) if name in defined]
    while waiting:
        name = waiting.pop()
        if name in reached:
            continue
        reached.add(name)
        waiting += [
            used for used in _names_in(defined[name]) if used in defined and used not in reached
        ]
    return reached


def _module_level_names(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for statement in body:
        if is_main_guard(statement):
            parts: list[ast.AST] = list(statement.orelse)
        elif isinstance(statement, FUNCTION_NODES):
            parts = [
                *statement.decorator_list,
                *statement.args.defaults,
                *[d for d in statement.args.kw_defaults if d is not None],
            ]
        elif isinstance(statement, ast.ClassDef):
            parts = [*statement.decorator_list, *statement.bases, *statement.keywords]
            names |= _module_level_names(
                [s for s in statement.body if not isinstance(s, FUNCTION_NODES)]
            )
        else:
            parts = [statement]
        for part in parts:
            names |= _names_in(part)
    return names


def _names_in(node: ast.AST) -> set[str]:
    return {child.id for child in ast.walk(node) if isinstance(child, ast.Name)}


# ---------------------------------------------------------------- the walk


class _Walker:
    def __init__(self, facts: FileFacts, project: Project, rules):
        self.facts, self.project, self.rules, self.values = facts, project, rules, rules.values
        tree = facts.source.tree
        self.is_script = facts.source.is_script
        # Only a script without a main guard re-runs its training in a spawned worker.
        self.unguarded = self.is_script and not has_main_guard(tree)
        self.at_import_names = runs_at_import(tree) if self.unguarded else set()

    def run(self) -> None:
        tree = self.facts.source.tree
        scope = Scope(tree.body, None, None, left_out=self.facts.source.left_out, facts=self.facts)
        self.body(
            tree.body,
            Where(self.facts, scope, self.values, at_import=self.unguarded),
            top_level=True,
        )

    def body(
        self,
        statements: Iterable[ast.stmt | ast.ExceptHandler],
        where: Where,
        top_level: bool = False,
    ) -> None:
        for statement in statements:
            if top_level and is_main_guard(statement):
                if self.is_script:  # an imported module's main block does not run
                    self.body(statement.body, replace(where, at_import=False))
                self.body(statement.orelse, where)
            else:
                self.statement(statement, where, top_level)
            if self.ends_block(statement, where):
                return

    def statement(
        self, node: ast.stmt | ast.ExceptHandler, where: Where, top_level: bool = False
    ) -> None:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        if self.facts.touches(first, node.end_lineno or node.lineno):
            self.node(node, where, top_level)

    def node(self, node: ast.AST, where: Where, top_level: bool = False) -> None:
        if isinstance(node, ast.Call):
            self.rules.call(node, where)
            for child in ast.iter_child_nodes(node):
                self.node(child, where)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            self.function(node, where, top_level)
        elif isinstance(node, ast.ClassDef):
            self.cls(node, where, top_level)
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
            self.conditional(node, where)
        elif isinstance(node, ast.BoolOp):
            self.bool_op(node, where)
        elif isinstance(node, _TRY_NODES):
            caught = " ".join(_caught(handler) for handler in node.handlers)
            self.body(
                node.body, replace(where, caught=f"{where.caught} {caught}") if caught else where
            )
            parts: list[ast.stmt | ast.ExceptHandler] = [
                *node.handlers,
                *node.orelse,
                *node.finalbody,
            ]
            for part in parts:
                self.statement(part, where)
        elif isinstance(node, (ast.stmt, ast.ExceptHandler)):
            if hasattr(node, "body") and not isinstance(node, ast.ExceptHandler):  # with, for
                for child in ast.iter_child_nodes(node):
                    if not isinstance(child, ast.stmt):
                        self.node(child, where)
                self.body(node.body, where)
                self.body(getattr(node, "orelse", ()), where)
                return
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self.statement(child, where)
                else:
                    self.node(child, where)
        else:
            for child in ast.iter_child_nodes(node):
                self.node(child, where)

    def conditional(self, node: ast.If | ast.While | ast.IfExp, where: Where) -> None:
        self.node(node.test, where)
        for part, place in zip((node.body, node.orelse), self.branches(node, where), strict=True):
            if place is None:
                continue
            if isinstance(part, list):
                self.body(part, place)
            else:
                self.node(part, place)

    def branches(
        self, node: ast.If | ast.While | ast.IfExp, where: Where
    ) -> tuple[Where | None, Where | None]:
        """The places of the branch taken when the test holds and of the other; None for a
        branch the plan never takes."""
        self.rules.branch(node, where)
        value, reads = self.values.test(node.test, where.scope)
        if value is UNKNOWN:
            inner = replace(where, device_unknown=True) if reads == "device" else where
            return inner, inner
        if reads is None:
            return where, where
        return (where, None) if value else (None, where)

    def bool_op(self, node: ast.BoolOp, where: Where) -> None:
        """`a and b`: b runs only when a holds (`or`: when it does not)."""
        ends_on = isinstance(node.op, ast.Or)
        for operand in node.values:
            self.node(operand, where)
            value, reads = self.values.test(operand, where.scope)
            if value is UNKNOWN:
                if reads == "device":
                    where = replace(where, device_unknown=True)
            elif reads is not None and bool(value) == ends_on:
                return

    def ends_block(self, statement: ast.AST, where: Where) -> bool:
        """Whether nothing after this statement in its block runs on the plan: it always stops
        there (walk.stops)."""
        return stops(statement, where)

    def cls(self, node: ast.ClassDef, where: Where, top_level: bool) -> None:
        if self.is_dead(node):
            return
        for part in (*node.decorator_list, *node.bases, *node.keywords):
            self.node(part, where)
        inner = where
        if top_level and self.unguarded:
            inner = replace(where, at_import=node.name in self.at_import_names)
        for statement in node.body:
            if isinstance(statement, FUNCTION_NODES):
                self.function(statement, inner, top_level=False, method=True)
            else:
                self.statement(statement, inner)

    def function(
        self,
        node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
        where: Where,
        top_level: bool,
        method: bool = False,
    ) -> None:
        if isinstance(node, ast.Lambda):
            scope = Scope([], node.args, node, where.scope)
            self.node(node.body, replace(where, scope=scope))
            return
        for decorator in node.decorator_list:
            self.node(decorator, where)
        if not method and self.is_dead(node):
            return
        at_import = where.at_import
        if top_level and self.unguarded:
            at_import = node.name in self.at_import_names
        scope = Scope(node.body, node.args, node, where.scope)
        self.body(node.body, replace(where, scope=scope, at_import=at_import))

    def is_dead(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
        """Defined, never named anywhere in the files read, and not decorated (a decorator
        may register it): it never runs."""
        return not node.decorator_list and not self.project.is_named(node.name)


def stops(statement: ast.AST, where: Where) -> bool:
    """Whether a statement always stops its block on the plan: raise, return, continue, break,
    exit(); an assert of a device test that does not hold there (or of any test the plan
    decides is false); an if/elif/else whose every branch the plan may take stops; a statement
    that always raises there (raises: a division by torch.cuda.device_count() without CUDA,
    os.environ["RANK"] where the plan removes RANK)."""
    if isinstance(
        statement, _ASSIGNMENTS
    ):  # the most common: looked at only on a line that may raise
        return (
            statement.value is not None
            and where.facts.may_raise(statement)
            and raises(statement.value, where)
        )
    if isinstance(statement, ast.Expr):
        return (
            _exits(statement.value)
            or where.facts.may_raise(statement)
            and raises(statement.value, where)
        )
    if isinstance(statement, _STOPPERS):
        return True
    if isinstance(statement, ast.If):
        if where.facts.may_raise(statement.test) and raises(statement.test, where):
            return True
        value, reads = where.values.test(statement.test, where.scope)
        taken = (
            (statement.body, statement.orelse)
            if value is UNKNOWN or reads is None
            else (statement.body if value else statement.orelse,)
        )
        return all(any(stops(inner, where) for inner in part) for part in taken)
    if isinstance(statement, ast.Assert):
        value, reads = where.values.test(statement.test, where.scope)
        return (
            reads == "device"
            and value is not True
            or reads is not None
            and value is False
            or where.facts.may_raise(statement)
            and raises(statement.test, where)
        )
    return False


_ASSIGNMENTS = (ast.Assign, ast.AugAssign, ast.AnnAssign)
# try, and try/except* from Python 3.11, which has try's fields
_TRY_NODES: tuple[type[ast.Try], ...] = (ast.Try, getattr(ast, "TryStar", ast.Try))
_STOPPERS = (ast.Raise, ast.Return, ast.Continue, ast.Break)


def raises(node: ast.AST, where: Where) -> bool:
    """Whether evaluating node always raises on the plan: a division by a value that is 0
    there (torch.cuda.device_count() without CUDA), os.environ[name] of a variable the plan
    removes. Only what is always evaluated is looked at."""
    values, scope = where.values, where.scope
    for child in _always_evaluated(node):
        if isinstance(child, ast.BinOp) and isinstance(child.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            right = values.possible(child.right, scope)
            formats = isinstance(child.op, ast.Mod) and (
                isinstance(child.left, (ast.Constant, ast.JoinedStr))
                or isinstance(values.possible(child.left, scope), str)
            )
            if type(right) in (int, float) and right == 0 and not formats:
                return True
        elif (
            isinstance(child, ast.Subscript)
            and isinstance(child.ctx, ast.Load)
            and values.possible(child.value, scope) is ENVIRON
        ):
            seen = values.environment.seen(values.value(child.slice, scope), read_at(child, scope))
            if seen is not None and not seen.present:
                return True
    return False


def _always_evaluated(node: ast.AST):
    """node and the expressions in it that run whenever it does: not a lambda's or a
    comprehension's body, not the second operand of `and`/`or`, not the branches of `x if c else y`."""
    pending = [node]
    while pending:
        child = pending.pop()
        yield child
        if isinstance(
            child, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
        ):
            continue
        if isinstance(child, ast.BoolOp):
            pending.append(child.values[0])
        elif isinstance(child, ast.IfExp):
            pending.append(child.test)
        elif isinstance(child, ast.Compare):
            pending += [child.left, child.comparators[0]]
        elif isinstance(
            child, (ast.expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.keyword)
        ):
            pending += [
                inner
                for inner in ast.iter_child_nodes(child)
                if isinstance(inner, (ast.expr, ast.keyword))
            ]


def _exits(node: ast.expr) -> bool:
    """sys.exit(...), exit(...), quit(...), os._exit(...)."""
    func = getattr(node, "func", None)
    name = getattr(func, "attr", None) or getattr(func, "id", None)
    return isinstance(node, ast.Call) and name in ("exit", "quit", "_exit")


def _caught(handler: ast.ExceptHandler) -> str:
    if handler.type is None:
        return "*"
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return " ".join(
        name.attr if isinstance(name, ast.Attribute) else getattr(name, "id", "*") for name in names
    )
