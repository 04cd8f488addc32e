"""What the code says, before any rule looks at it: imports, scopes, and the conditions each
call sits under.

`prepare(files)` reads each file's imports; `scan(project, visit)` walks the files and calls
`visit(call, where)` for each call that can run. Only statements on lines that mention what a
rule looks for (selection.py) are walked into;
calls in functions nothing names, and in an imported module's main block, are left out.
`Where` tells the rules what they need about the call's place: the words of the conditions
around it, what a try around it catches, whether it runs when a spawned worker imports the
script again, and the scope that names resolve in.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import cached_property

from mpslaunch.check.reading import SourceFile
from mpslaunch.check.selection import module_literal_names

FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef)
DEFINITION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_START_METHOD = re.compile(r"""set_start_method\(\s*["'](\w+)["']""")
_WORD = re.compile(r"\w+")
_GLOBAL = re.compile(r"(?m)^[ \t]*global[ \t]+([\w \t,]+)")
_DYNAMIC = re.compile(r"\b(?:exec|globals|vars)\s*\(")  # can rebind any module name


@dataclass
class FileFacts:
    """One file's imports, and the lines worth walking into."""

    source: SourceFile
    aliases: dict[str, str]  # local name -> the dotted name it imports: dist -> torch.distributed
    start_method: str | None  # set_start_method("...") with a literal, anywhere in the file
    imports_accelerate: bool
    candidate_lines: list[int]  # sorted
    constants_trusted: bool  # no exec() or globals(): a module name bound once stays bound
    literal_names: frozenset[str]  # names some module-level line binds to a literal
    declared_global: frozenset[str]  # names a `global` statement rebinds from a function

    def qualified(self, node: ast.expr) -> str | None:
        """`torch.cuda.amp.autocast` for a call's function, through the file's imports; None
        when the name is not imported (a local name, a method of some object)."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.aliases:
            return None
        parts.append(self.aliases[node.id])
        return ".".join(reversed(parts))

    def touches(self, first: int, last: int) -> bool:
        """Whether a line from first to last mentions something a rule looks for."""
        lines = self.candidate_lines
        index = bisect.bisect_left(lines, first)
        return index < len(lines) and lines[index] <= last


class Scope:
    """The names a function (or the module) binds, worked out only when a rule asks."""

    def __init__(self, body: list[ast.stmt], parameters: ast.arguments | None,
                 function: ast.AST | None, parent: "Scope | None" = None, left_out: tuple[str, ...] = ()):
        self.body, self.parameters, self.function, self.parent = body, parameters, function, parent
        self.left_out = left_out

    @cached_property
    def bindings(self) -> dict[str, list[ast.AST | None]]:
        bound = bindings(self.body, self.parameters)
        for name in self.left_out:  # bound, to something not read
            bound.setdefault(name, []).append(None)
        return bound

    def lookup(self, name: str) -> tuple[ast.AST | None, "Scope | None"]:
        """What `name` stands for here when it is bound exactly once (an expression, a def or a
        class), and the scope that binds it; (None, None) otherwise."""
        scope = self
        while scope is not None:
            values = scope.bindings.get(name)
            if values is not None:
                return (values[0], scope) if len(values) == 1 else (None, None)
            scope = scope.parent
        return None, None

    @property
    def name(self) -> str:
        return getattr(self.function, "name", "<module>")


@dataclass(frozen=True)
class Where:
    facts: FileFacts
    scope: Scope
    guard: str = ""  # lower-case words of every condition around the call
    caught: str = ""  # the exception names the try statements around it catch ("*": all)
    at_import: bool = True  # runs when the script is imported again (a spawned worker does)

    def guarded_by(self, words: Iterable[str]) -> bool:
        return any(word in self.guard for word in words)

    def catches(self, errors: Iterable[str]) -> bool:
        """Whether a try around the call catches one of these exceptions (or everything)."""
        caught = self.caught.split()
        return "*" in caught or any(error in caught for error in (*errors, "Exception", "BaseException"))

    def literal(self, node: ast.expr | None) -> tuple[object, int | None] | None:
        """(value, line of its definition or None) of a literal, or of a module-level name bound
        once to a literal and not rebound where the call is; None for anything else."""
        if isinstance(node, ast.Constant):
            return node.value, None
        if isinstance(node, ast.Name) and self.facts.constants_trusted \
                and node.id in self.facts.literal_names:
            value, scope = self.scope.lookup(node.id)
            if isinstance(value, ast.Constant) and scope is not None and scope.function is None \
                    and node.id not in self.facts.declared_global:
                return value.value, value.lineno
        return None


@dataclass(frozen=True)
class Project:
    """The files read, with their facts."""

    facts: tuple[FileFacts, ...]

    @property
    def uses_accelerate(self) -> bool:
        return any(facts.imports_accelerate for facts in self.facts)

    @cached_property
    def _texts(self) -> tuple[str, ...]:
        return tuple(facts.source.text for facts in self.facts)

    def is_named(self, name: str) -> bool:
        """Whether `name` appears anywhere besides its own definition (a call, a reference, an
        attribute; inside a longer word or a comment too, which only errs towards checking)."""
        return sum(text.count(name) for text in self._texts) > 1


def prepare(files: Iterable[SourceFile]) -> Project:
    return Project(tuple(_read_facts(source) for source in files))


def scan(project: Project, visit: Callable[[ast.Call, Where], None]) -> None:
    """Call `visit` for each call in the project's files that can run, with its place."""
    for facts in project.facts:
        _Walker(facts, project, visit).run()


# ---------------------------------------------------------------- the facts


def _read_facts(source: SourceFile) -> FileFacts:
    aliases: dict[str, str] = {}
    for node in source.imports:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:  # `import torch.distributed` binds torch
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    text = source.text
    method = _START_METHOD.search(text)
    return FileFacts(source, aliases, method.group(1) if method else None,
                     any(name.split(".")[0] == "accelerate" for name in aliases.values()),
                     source.wanted_lines, not _DYNAMIC.search(text), module_literal_names(text),
                     frozenset(_WORD.findall(" ".join(_GLOBAL.findall(text)))))


def is_main_guard(node: ast.AST) -> bool:
    """`if __name__ == "__main__":` (either way round, or and-ed with more conditions)."""
    if not isinstance(node, ast.If):
        return False
    tests = node.test.values if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And) \
        else [node.test]
    return any(_is_main_test(test) for test in tests)


def _is_main_test(test: ast.expr) -> bool:
    if not isinstance(test, ast.Compare):
        return False
    sides = [test.left, *test.comparators]
    return (len(sides) == 2 and isinstance(test.ops[0], ast.Eq)
            and any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides)
            and any(isinstance(side, ast.Constant) and side.value == "__main__" for side in sides))


def has_main_guard(tree: ast.Module) -> bool:
    return any(is_main_guard(statement) for statement in tree.body)


# ---------------------------------------------------------------- scopes


def bindings(body: list[ast.stmt], parameters: ast.arguments | None = None
             ) -> dict[str, list[ast.AST | None]]:
    """What a body binds, not looking into the functions and classes it defines: name -> the
    values bound to it (None for a binding that is not `name = value`, `def` or `class`)."""
    bound: dict[str, list[ast.AST | None]] = {}
    if parameters is not None:
        for argument in (*parameters.posonlyargs, *parameters.args, *parameters.kwonlyargs,
                         parameters.vararg, parameters.kwarg):
            if argument is not None:
                bound.setdefault(argument.arg, []).append(None)
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, DEFINITION_NODES):
            bound.setdefault(node.name, []).append(node)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            bound.setdefault(node.targets[0].id, []).append(node.value)
            pending.append(node.value)
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.setdefault(node.id, []).append(None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound.setdefault((alias.asname or alias.name).split(".")[0], []).append(None)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                bound.setdefault(name, []).extend((None, None))
        pending.extend(ast.iter_child_nodes(node))
    return bound


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
        waiting += [used for used in _names_in(defined[name]) if used in defined and used not in reached]
    return reached


def _module_level_names(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for statement in body:
        if is_main_guard(statement):
            parts: list[ast.AST] = list(statement.orelse)
        elif isinstance(statement, FUNCTION_NODES):
            parts = [*statement.decorator_list, *statement.args.defaults,
                     *[d for d in statement.args.kw_defaults if d is not None]]
        elif isinstance(statement, ast.ClassDef):
            parts = [*statement.decorator_list, *statement.bases, *statement.keywords]
            names |= _module_level_names([s for s in statement.body if not isinstance(s, FUNCTION_NODES)])
        else:
            parts = [statement]
        for part in parts:
            names |= _names_in(part)
    return names


def _names_in(node: ast.AST) -> set[str]:
    return {child.id for child in ast.walk(node) if isinstance(child, ast.Name)}


# ---------------------------------------------------------------- the walk


class _Walker:
    def __init__(self, facts: FileFacts, project: Project, visit: Callable[[ast.Call, Where], None]):
        self.facts, self.project, self.visit_call = facts, project, visit
        tree = facts.source.tree
        self.is_script = facts.source.is_script
        # Only a script without a main guard re-runs its training in a spawned worker.
        self.unguarded = self.is_script and not has_main_guard(tree)
        self.at_import_names = runs_at_import(tree) if self.unguarded else set()

    def run(self) -> None:
        tree = self.facts.source.tree
        scope = Scope(tree.body, None, None, left_out=self.facts.source.left_out)
        where = Where(self.facts, scope, at_import=self.unguarded)
        for statement in tree.body:
            if is_main_guard(statement):
                if self.is_script:  # an imported module's main block does not run
                    self.body(statement.body, replace(where, at_import=False))
                self.body(statement.orelse, where)
            else:
                self.statement(statement, where, top_level=True)

    def body(self, statements: Iterable[ast.AST], where: Where) -> None:
        for statement in statements:
            self.statement(statement, where)

    def statement(self, node: ast.AST, where: Where, top_level: bool = False) -> None:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        if self.facts.touches(first, node.end_lineno or node.lineno):
            self.node(node, where, top_level)

    def node(self, node: ast.AST, where: Where, top_level: bool = False) -> None:
        kind = type(node)
        if kind is ast.Call:
            self.visit_call(node, where)
            for child in ast.iter_child_nodes(node):
                self.node(child, where)
        elif kind in (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda):
            self.function(node, where, top_level)
        elif kind is ast.ClassDef:
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
        elif kind in (ast.If, ast.While):
            self.node(node.test, where)
            guarded = _guarded(where, node.test)
            self.body(node.body, guarded)
            self.body(node.orelse, guarded)
        elif kind is ast.IfExp:
            self.node(node.test, where)
            guarded = _guarded(where, node.test)
            self.node(node.body, guarded)
            self.node(node.orelse, guarded)
        elif kind is ast.BoolOp:
            guarded = where
            for value in node.values:
                self.node(value, guarded)
                guarded = _guarded(guarded, value)
        elif kind in (ast.Try, getattr(ast, "TryStar", ast.Try)):
            caught = " ".join(_caught(handler) for handler in node.handlers)
            self.body(node.body, replace(where, caught=f"{where.caught} {caught}") if caught else where)
            for part in (*node.handlers, *node.orelse, *node.finalbody):
                self.statement(part, where)
        elif isinstance(node, ast.stmt) or kind is ast.ExceptHandler:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self.statement(child, where)
                else:
                    self.node(child, where)
        else:
            for child in ast.iter_child_nodes(node):
                self.node(child, where)

    def function(self, node: ast.AST, where: Where, top_level: bool, method: bool = False) -> None:
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

    def is_dead(self, node: ast.AST) -> bool:
        """Defined, never named anywhere in the files read, and not decorated (a decorator
        may register it): it never runs."""
        return not node.decorator_list and not self.project.is_named(node.name)


def _guarded(where: Where, test: ast.AST) -> Where:
    return replace(where, guard=f"{where.guard} {condition_words(test)}")


def _caught(handler: ast.ExceptHandler) -> str:
    if handler.type is None:
        return "*"
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return " ".join(name.attr if isinstance(name, ast.Attribute) else getattr(name, "id", "*")
                    for name in names)


def condition_words(test: ast.AST) -> str:
    words = []
    for node in ast.walk(test):
        if isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            words.append(node.value)
    return " ".join(words).lower()
