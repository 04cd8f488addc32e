"""What the code says, before any rule looks at it: imports, scopes, and the place of each call.

`prepare(files)` reads each file's imports; the walk (walk.py) then hands each call that can
run on the plan to the rules, with its place. `Where` tells the
rules what they need about that place: whether a device test whose answer is unknown stands
around it, what a try around it catches, whether it runs when a spawned worker imports the
script again, and the scope that names resolve in.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from mpslaunch.check.reading import SourceFile, statements
from mpslaunch.check.selection import line_numbers, module_literal_names

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from mpslaunch.check.values import Values

FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef)
DEFINITION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_START_METHOD = re.compile(r"""set_start_method\(\s*["'](\w+)["']""")
_WORD = re.compile(r"\w+")
_GLOBAL = re.compile(r"(?m)^[ \t]*global[ \t]+([\w \t,]+)")
_DYNAMIC = re.compile(r"\b(?:exec|globals|vars)\s*\(")  # can rebind any module name
_OPTION = re.compile(r"(?:add_argument|set_defaults)\(")
_ATTRIBUTE_SET = re.compile(r"(?m)^[ \t]*(?!self\.)[A-Za-z_]\w*\.\w+[ \t]*=(?!=)")
# `use_cuda = ...torch.cuda.is_available()`: a name bound on a line that reads the device
_DEVICE_BINDING = re.compile(
    r"(?m)^[ \t]*([A-Za-z_]\w*)[ \t]*=(?!=)[^\n]*(?:cuda|mps|device|accelerator)"
)
_CUDA_BINDING = re.compile(r"(?m)^[ \t]*([A-Za-z_]\w*)[ \t]*=(?!=)[^\n]*cuda")
_DEVICE_COUNT = re.compile("device_count")
_LAMBDA = re.compile("lambda")
_BOUND = re.compile(r"[ \t]*([A-Za-z_]\w*)[ \t]*=(?!=)")  # a line that binds a name


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

    @cached_property
    def device_names(self) -> frozenset[str]:
        """Names some line binds to an expression that mentions the device: the only names
        whose binding can make a condition a device test (the others are not looked up)."""
        return frozenset(_DEVICE_BINDING.findall(self.source.words))

    @cached_property
    def _lines(self) -> list[str]:
        return self.source.words.split("\n")

    @cached_property
    def raising_lines(self) -> list[int]:
        """The sorted lines where an expression may always raise on the plan (walk.raises)."""
        lines = self.source.lines
        texts = self._lines if lines.variables else []
        return sorted(
            {
                *line_numbers(self.source.words, _DEVICE_COUNT),
                *(line for line in lines.variables if "environ[" in texts[line - 1]),
            }
        )

    def may_raise(self, node: ast.stmt | ast.expr) -> bool:
        return _spans(self.raising_lines, node)

    @cached_property
    def lambda_lines(self) -> list[int]:
        return line_numbers(self.source.words, _LAMBDA)

    def may_hold_a_lambda(self, node: ast.stmt | ast.expr) -> bool:
        return _spans(self.lambda_lines, node)

    @cached_property
    def environment_names(self) -> frozenset[str]:
        """Names some line binds to an expression that reads os.environ (`ddp = int(os.environ
        .get("RANK", -1)) != -1`): conditions on them are decided by the plan."""
        texts = self._lines if self.source.lines.variables else []
        return frozenset(
            match.group(1)
            for match in (_BOUND.match(texts[line - 1]) for line in self.source.lines.variables)
            if match
        )

    @cached_property
    def cuda_names(self) -> frozenset[str]:
        """Names some line binds to an expression that mentions cuda (`loc = f"cuda:{rank}"`)."""
        return frozenset(_CUDA_BINDING.findall(self.source.words))

    @cached_property
    def option_calls(self) -> list[ast.Call]:
        """Its `parser.add_argument(...)` and `parser.set_defaults(...)` calls, in order."""
        return [
            node
            for node in self.nodes_on(_OPTION)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("add_argument", "set_defaults")
        ]

    @cached_property
    def attribute_assignments(self) -> list[ast.Assign]:
        """`args.cuda = ...`: one attribute of a plain name (not self) set."""
        return [
            node
            for node in self.nodes_on(_ATTRIBUTE_SET)
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Attribute)
            and isinstance(node.targets[0].value, ast.Name)
            and node.targets[0].value.id != "self"
        ]

    def binding(self, name: str) -> tuple[ast.expr | None, None]:
        """What `name = ...` binds, when the file has exactly one such line (for a name in a
        function the check has no scope for)."""
        pattern = re.compile(rf"(?m)^[ \t]*{re.escape(name)}[ \t]*=(?!=)")
        values = [
            node.value
            for node in self.nodes_on(pattern)
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and getattr(node.targets[0], "id", None) == name
        ]
        return (values[0], None) if len(values) == 1 else (None, None)

    def nodes_on(self, pattern: re.Pattern) -> Iterable[ast.AST]:
        """The nodes of the simple statements on the lines that match pattern."""
        lines = line_numbers(self.source.words, pattern)
        for statement in statements(self.source.tree.body, lines):
            if not hasattr(statement, "body"):
                yield from ast.walk(statement)


class Scope:
    """The names a function (or the module) binds, worked out only when a rule asks."""

    def __init__(
        self,
        body: list[ast.stmt],
        parameters: ast.arguments | None,
        function: ast.AST | None,
        parent: Scope | None = None,
        left_out: tuple[str, ...] = (),
        facts: FileFacts | None = None,
    ):
        self.body, self.parameters, self.function, self.parent = body, parameters, function, parent
        self.left_out = left_out
        self.facts = facts if facts is not None else getattr(parent, "facts", None)

    @cached_property
    def bindings(self) -> dict[str, list[ast.AST | None]]:
        bound = bindings(self.body, self.parameters)
        for name in self.left_out:  # bound, to something not read
            bound.setdefault(name, []).append(None)
        return bound

    @cached_property
    def parameter_names(self) -> frozenset[str]:
        arguments = self.parameters
        if arguments is None:  # the module's scope
            return frozenset()
        return frozenset(
            argument.arg
            for argument in (
                *arguments.posonlyargs,
                *arguments.args,
                *arguments.kwonlyargs,
                arguments.vararg,
                arguments.kwarg,
            )
            if argument is not None
        )

    def lookup(self, name: str) -> tuple[ast.AST | None, Scope | None]:
        """What `name` stands for here when it is bound exactly once (an expression, a def or a
        class), and the scope that binds it; (None, None) otherwise."""
        scope: Scope | None = self
        while scope is not None:
            if scope.parameters is not None and name in scope.parameter_names:
                return None, scope  # a parameter: its value comes from the caller
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
    values: Values  # what expressions are on the plan
    device_unknown: bool = False  # under a device test whose answer on the plan is unknown
    caught: str = ""  # the exception names the try statements around it catch ("*": all)
    at_import: bool = True  # runs when the script is imported again (a spawned worker does)

    def catches(self, errors: Iterable[str]) -> bool:
        """Whether a try around the call catches one of these exceptions (or everything)."""
        caught = self.caught.split()
        return "*" in caught or any(
            error in caught for error in (*errors, "Exception", "BaseException")
        )

    def literal(self, node: ast.expr | None) -> tuple[object, int | None] | None:
        """(value, line of its definition or None) of a literal, or of a module-level name bound
        once to a literal and not rebound where the call is; None for anything else."""
        if isinstance(node, ast.Constant):
            return node.value, None
        if (
            isinstance(node, ast.Name)
            and self.facts.constants_trusted
            and node.id in self.facts.literal_names
        ):
            value, scope = self.scope.lookup(node.id)
            if (
                isinstance(value, ast.Constant)
                and scope is not None
                and scope.function is None
                and node.id not in self.facts.declared_global
            ):
                return value.value, value.lineno
        return None

    def value(self, node: ast.AST | None) -> object:
        """What node is on the plan (values.UNKNOWN when the source does not tell)."""
        return self.values.value(node, self.scope)


@dataclass(frozen=True)
class Project:
    """The files read, with their facts."""

    facts: tuple[FileFacts, ...]
    writers: tuple[FileFacts, ...] = ()  # scripts beside it that write a file it loads (not walked)

    @property
    def uses_accelerate(self) -> bool:
        return any(facts.imports_accelerate for facts in self.facts)

    @cached_property
    def _words(self) -> Counter:
        return Counter(word for facts in self.facts for word in _WORD.findall(facts.source.words))

    def is_named(self, name: str) -> bool:
        """Whether `name` appears anywhere besides its own definition (a call, a reference, an
        attribute, a string or a comment: what only errs towards checking)."""
        return self._words[name] > 1

    @cached_property
    def mentions_mps(self) -> bool:
        """Whether any file read chooses mps itself somewhere."""
        return any(
            re.search(r"""["']mps["']|backends\.mps|torch\.accelerator""", facts.source.words)
            for facts in self.facts
        )


def _spans(lines: list[int], node: ast.stmt | ast.expr) -> bool:
    """Whether one of the sorted lines lies within node."""
    index = bisect.bisect_left(lines, node.lineno)
    return index < len(lines) and lines[index] <= (node.end_lineno or node.lineno)


def prepare(files: Iterable[SourceFile], writers: Iterable[SourceFile] = ()) -> Project:
    return Project(
        tuple(_read_facts(source) for source in files),
        tuple(_read_facts(source) for source in writers),
    )


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
    if "torch" not in aliases and any(name.endswith(".*") for name in aliases.values()):
        aliases["torch"] = "torch"  # `from utils import *` of a module that imports torch
    text = source.words
    method = _START_METHOD.search(text)
    return FileFacts(
        source,
        aliases,
        method.group(1) if method else None,
        any(name.split(".")[0] == "accelerate" for name in aliases.values()),
        source.wanted_lines,
        not _DYNAMIC.search(text),
        module_literal_names(text),
        frozenset(_WORD.findall(" ".join(_GLOBAL.findall(text)))),
    )


def bindings(
    body: list[ast.stmt], parameters: ast.arguments | None = None
) -> dict[str, list[ast.AST | None]]:
    """What a body binds, not looking into the functions and classes it defines: name -> the
    values bound to it (None for a binding that is not `name = value`, `with v as name`, `def`
    or `class`)."""
    bound: dict[str, list[ast.AST | None]] = {}
    if parameters is not None:
        for argument in (
            *parameters.posonlyargs,
            *parameters.args,
            *parameters.kwonlyargs,
            parameters.vararg,
            parameters.kwarg,
        ):
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
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            bound.setdefault(node.targets[0].id, []).append(node.value)
            pending.append(node.value)
            continue
        if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            bound.setdefault(node.optional_vars.id, []).append(node.context_expr)
            pending.append(node.context_expr)
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
