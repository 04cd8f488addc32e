"""What the code says, before any rule looks at it: imports, constants, scopes, and the
conditions each call sits under.

`prepare(files)` reads the facts; `scan(project, visit)` walks every file once and calls `visit(call, where)` for each call that
can run: calls in functions nothing names, and in an imported module's main block, are left
out. `Where` tells the rules what they need about the call's place (the words of the
conditions around it, whether a try catches it, whether it runs when the script is imported
again by a spawned worker, the scope that names resolve in).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mpslaunch.check.reading import SourceFile

FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef)
DEFINITION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclass
class FileFacts:
    """One file's imports and module-level constants."""

    source: SourceFile
    aliases: dict[str, str]  # local name -> the dotted name it imports: dist -> torch.distributed
    constants: dict[str, tuple[object, int]]  # a name bound once, to a literal -> (value, line)
    start_method: str | None  # set_start_method("...") with a literal, anywhere in the file
    imports_accelerate: bool

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

    def literal(self, node: ast.expr | None) -> tuple[object, int | None] | None:
        """(value, line of the constant's definition or None) of a literal or of a name bound
        once to one; None for anything else."""
        if isinstance(node, ast.Constant):
            return node.value, None
        if isinstance(node, ast.Name) and node.id in self.constants:
            return self.constants[node.id]
        return None


@dataclass
class Scope:
    """The names a function (or the module) binds: name -> the values bound to it (None for a
    binding that is not `name = value` or `def name`)."""

    bindings: dict[str, list[ast.AST | None]]
    function: ast.AST | None  # None: the module
    parent: "Scope | None" = None

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


@dataclass(frozen=True)
class Project:
    """The files read, with their facts, and every name any of them uses."""

    facts: tuple[FileFacts, ...]
    named: frozenset[str]

    @property
    def uses_accelerate(self) -> bool:
        return any(facts.imports_accelerate for facts in self.facts)


def prepare(files: Iterable[SourceFile]) -> Project:
    read = [_read_facts(source) for source in files]
    return Project(tuple(facts for facts, _ in read),
                   frozenset().union(*(names for _, names in read)))


def scan(project: Project, visit: Callable[[ast.Call, Where], None]) -> None:
    """Call `visit` for each call in the project's files that can run, with its place."""
    for facts in project.facts:
        _Walker(facts, project.named, visit).run()


# ---------------------------------------------------------------- the first pass: facts


def _read_facts(source: SourceFile) -> tuple[FileFacts, set[str]]:
    """The file's facts, and every name it uses (to tell live functions from dead ones)."""
    aliases: dict[str, str] = {}
    stores: dict[str, int] = {}
    named: set[str] = set()
    start_method = None
    dynamic = False  # exec() or globals() can rebind any module name
    for node in ast.walk(source.tree):
        kind = type(node)
        if kind is ast.Name:
            if type(node.ctx) is ast.Load:
                named.add(node.id)
                dynamic = dynamic or node.id in ("exec", "globals", "vars")
            else:
                stores[node.id] = stores.get(node.id, 0) + 1
        elif kind is ast.Attribute:
            named.add(node.attr)
        elif kind is ast.Call:
            method = _called_name(node)
            if method == "set_start_method" and node.args and isinstance(node.args[0], ast.Constant):
                start_method = str(node.args[0].value)
        elif kind is ast.Import:
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:  # `import torch.distributed` binds torch
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif kind is ast.ImportFrom and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif kind in (ast.arg, ast.Global, ast.Nonlocal, *DEFINITION_NODES):
            for name in _bound_names(node):
                stores[name] = stores.get(name, 0) + 1
    constants = {} if dynamic else _constants(source.tree, stores)
    accelerate = any(name.split(".")[0] == "accelerate" for name in aliases.values())
    return FileFacts(source, aliases, constants, start_method, accelerate), named


def _bound_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names) * 2  # a global statement means the name is rebound somewhere
    return [node.name]


def _constants(tree: ast.Module, stores: dict[str, int]) -> dict[str, tuple[object, int]]:
    constants = {}
    for statement in tree.body:
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and isinstance(statement.value, ast.Constant)
                and stores.get(statement.targets[0].id) == 1):
            constants[statement.targets[0].id] = (statement.value.value, statement.lineno)
    return constants


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def is_main_guard(node: ast.AST) -> bool:
    """`if __name__ == "__main__":` (either way round)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    sides = [test.left, *test.comparators]
    return (len(sides) == 2 and isinstance(test.ops[0], ast.Eq)
            and any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides)
            and any(isinstance(side, ast.Constant) and side.value == "__main__" for side in sides))


# ---------------------------------------------------------------- scopes


def bindings(statements: list[ast.stmt], parameters: ast.arguments | None = None
             ) -> dict[str, list[ast.AST | None]]:
    """What a body binds, not looking into the functions and classes it defines."""
    bound: dict[str, list[ast.AST | None]] = {}
    if parameters is not None:
        for argument in (*parameters.posonlyargs, *parameters.args, *parameters.kwonlyargs,
                         parameters.vararg, parameters.kwarg):
            if argument is not None:
                bound.setdefault(argument.arg, []).append(None)
    pending: list[ast.AST] = list(statements)
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


def _module_level_names(statements: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for statement in statements:
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


# ---------------------------------------------------------------- the second pass: calls in context


class _Walker:
    def __init__(self, facts: FileFacts, named: set[str], visit: Callable[[ast.Call, Where], None]):
        self.facts, self.named, self.visit_call = facts, named, visit
        self.is_script = facts.source.is_script
        self.at_import_names = runs_at_import(facts.source.tree) if self.is_script else set()

    def run(self) -> None:
        tree = self.facts.source.tree
        where = Where(self.facts, Scope(bindings(tree.body), None), at_import=self.is_script)
        for statement in tree.body:
            if is_main_guard(statement):
                if self.is_script:  # an imported module's main block does not run
                    self.body(statement.body, _replace(where, at_import=False))
                self.body(statement.orelse, where)
            else:
                self.node(statement, where, top_level=True)

    def body(self, statements: Iterable[ast.AST], where: Where) -> None:
        for statement in statements:
            self.node(statement, where)

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
            if top_level and self.is_script:
                inner = _replace(where, at_import=node.name in self.at_import_names)
            for statement in node.body:
                if isinstance(statement, FUNCTION_NODES):
                    self.function(statement, inner, top_level=False, method=True)
                else:
                    self.node(statement, inner)
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
            for index, value in enumerate(node.values):
                guarded = where
                for earlier in node.values[:index]:
                    guarded = _guarded(guarded, earlier)
                self.node(value, guarded)
        elif kind in (ast.Try, getattr(ast, "TryStar", ast.Try)):
            caught = " ".join(_caught(handler) for handler in node.handlers)
            self.body(node.body, _replace(where, caught=f"{where.caught} {caught}") if caught else where)
            for part in (*node.handlers, *node.orelse, *node.finalbody):
                self.node(part, where)
        else:
            for child in ast.iter_child_nodes(node):
                self.node(child, where)

    def function(self, node: ast.AST, where: Where, top_level: bool, method: bool = False) -> None:
        if isinstance(node, ast.Lambda):
            scope = Scope(bindings([], node.args), node, where.scope)
            self.node(node.body, _replace(where, scope=scope))
            return
        for decorator in node.decorator_list:
            self.node(decorator, where)
        if not method and self.is_dead(node):
            return
        at_import = where.at_import
        if top_level and self.is_script:
            at_import = node.name in self.at_import_names
        scope = Scope(bindings(node.body, node.args), node, where.scope)
        self.body(node.body, _replace(where, scope=scope, at_import=at_import))

    def is_dead(self, node: ast.AST) -> bool:
        """Defined, never named anywhere in the files read, and not decorated (a decorator
        may register it): it never runs."""
        return not node.decorator_list and node.name not in self.named


def _replace(where: Where, **changes) -> Where:
    values = {name: getattr(where, name) for name in ("facts", "scope", "guard", "caught", "at_import")}
    values.update(changes)
    return Where(**values)


def _guarded(where: Where, test: ast.AST) -> Where:
    return _replace(where, guard=f"{where.guard} {condition_words(test)}")


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
