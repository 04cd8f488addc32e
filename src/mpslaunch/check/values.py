"""What an expression is on the plan, as far as the source tells: the answers of
`torch.cuda.is_available()` and its kin on that machine, the launcher's variables in
os.environ (environment.py), literals, names bound once, the defaults of the script's argparse
options, and what `and`, `not`, `==`, `int()` and `x if c else y` make of them. A value that
differs between the plan's processes (RANK on several) is each of its possible values
(`Among`): a comparison they all answer alike has that answer.

A script is judged as it runs when nothing is passed: an option stands for its default. A
condition is a device test when it reads the device or its availability (directly or through
a name bound from one); a device test whose value cannot be told hides both its branches. A
condition on the launcher's variables is decided by the plan; any other condition (the main
process, a precision flag) hides nothing.
"""

from __future__ import annotations

import ast
import re
from functools import cached_property

from mpslaunch.check.environment import Environment

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from typing import Any

UNKNOWN = type("Unknown", (), {"__repr__": lambda self: "UNKNOWN"})()
ENVIRON = type("Environ", (), {"__repr__": lambda self: "os.environ"})()  # the mapping itself
_ENVIRONMENT_READS = ("os.getenv", "os.environ.get")
_CONVERSIONS = {"int": int, "str": str}
_NONE = ast.Constant(None)  # the default of os.environ.get(name)
_DEPTH = 12  # names bound to names: deeper than this is unknown (and cycles end)
_PARTS = re.compile(r"[a-z]+")
_DEVICE_PARTS = (
    "cuda",
    "device",
    "devices",
    "mps",
)  # a name whose value, unknown, reads the device
_GPU_PARTS = ("gpu", "gpus")  # an option that, known, tells whether a GPU is used
CUDA_TENSOR = re.compile(r"^torch\.cuda\.\w*Tensor$")
# The answers of the device queries a script asks, by what the plan has.
_QUERIES = {
    "torch.cuda.is_available": lambda t: t.device == "cuda",
    "torch.cuda.is_bf16_supported": lambda t: UNKNOWN if t.device == "cuda" else False,
    "torch.cuda.device_count": lambda t: UNKNOWN if t.device == "cuda" else 0,
    "torch.backends.mps.is_available": lambda t: t.system == "Darwin",
    "torch.backends.mps.is_built": lambda t: t.system == "Darwin",
    "torch.accelerator.is_available": lambda t: t.device == "cuda" or t.system == "Darwin",
    "torch.accelerator.current_accelerator": lambda t: (
        t.device if t.device == "cuda" else "mps" if t.system == "Darwin" else None
    ),
}


class Values:
    """Evaluates expressions of the project's files on one target."""

    def __init__(self, target, project) -> None:
        self.target, self.project = target, project
        self.environment = Environment(target.device, target.processes, project.facts)
        self._memo: dict[int, object] = {}
        self._busy: set[int] = set()

    # ------------------------------------------------------------ the script's options

    @cached_property
    def _options(self) -> dict[str, object]:
        """Each argparse option's default (UNKNOWN when required or given twice differently);
        `parser.set_defaults(name=value)` has the last word."""
        found: dict[str, object] = {}
        settled: dict[str, object] = {}
        for facts in self.project.facts:
            for call in facts.option_calls:
                if call.func.attr == "set_defaults":
                    settled.update(
                        (k.arg, k.value.value if isinstance(k.value, ast.Constant) else UNKNOWN)
                        for k in call.keywords
                        if k.arg
                    )
                    continue
                dest, default = _option(call)
                if dest is not None:
                    found[dest] = default if found.get(dest, default) == default else UNKNOWN
        return {**found, **settled}

    @cached_property
    def _attributes(self) -> dict[str, list[ast.expr]]:
        """`args.cuda = ...` anywhere: the values assigned to each attribute of a plain name."""
        found: dict[str, list[ast.expr]] = {}
        for facts in self.project.facts:
            for node in facts.attribute_assignments:
                found.setdefault(node.targets[0].attr, []).append(node.value)
        return found

    # ------------------------------------------------------------ values

    def value(self, node: ast.AST | None, scope) -> object:
        """The value of node on the target, or UNKNOWN (also when the plan's processes differ)."""
        return settled(self.possible(node, scope))

    def possible(self, node: ast.AST | None, scope) -> object:
        """The value of node on the target: UNKNOWN, one value, or the values of `Among`."""
        if node is None:
            return UNKNOWN
        key = id(node)
        if key in self._memo:
            return self._memo[key]
        if key in self._busy or len(self._busy) > _DEPTH:
            return UNKNOWN
        self._busy.add(key)
        try:
            result = self._value(node, scope)
        except (TypeError, RecursionError):
            result = UNKNOWN  # an operation the script would fail on too
        finally:
            self._busy.discard(key)
        self._memo[key] = result
        return result

    def _value(self, node: ast.AST, scope) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if self.qualified(node, scope) == "os.environ":
                return ENVIRON
            bound, where = scope.lookup(node.id) if scope is not None else (None, None)
            return self.possible(bound, where) if isinstance(bound, ast.expr) else UNKNOWN
        if isinstance(node, ast.Attribute):
            return self._attribute(node, scope)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            operand = truth(self.possible(node.operand, scope))
            return UNKNOWN if operand is UNKNOWN else not operand
        if isinstance(node, ast.UnaryOp) and isinstance(
            node.op, ast.USub
        ):  # -1, a default meaning "none"
            return _converted(lambda number: -number, self.possible(node.operand, scope))
        if isinstance(node, ast.BoolOp):
            return self._bool_op(node, scope)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = self.possible(node.left, scope), self.possible(node.comparators[0], scope)
            if right is ENVIRON and isinstance(
                node.ops[0], (ast.In, ast.NotIn)
            ):  # "RANK" in os.environ
                seen = self.environment.seen(settled(left), read_at(node, scope))
                return UNKNOWN if seen is None else seen.present == isinstance(node.ops[0], ast.In)
            return _compare(node.ops[0], left, right)
        if isinstance(node, ast.Subscript) and self.possible(node.value, scope) is ENVIRON:
            return self._read(node.slice, None, scope)
        if isinstance(node, ast.IfExp):
            test = truth(self.possible(node.test, scope))
            return (
                UNKNOWN
                if test is UNKNOWN
                else self.possible(node.body if test else node.orelse, scope)
            )
        if isinstance(node, ast.Call):
            return self._call(node, scope)
        if (
            isinstance(node, ast.JoinedStr)
            and node.values
            and isinstance(node.values[0], ast.Constant)
        ):
            return Prefix(str(node.values[0].value))
        return UNKNOWN

    def _attribute(self, node: ast.Attribute, scope) -> object:
        if node.attr == "type":  # device.type
            device = self.possible(node.value, scope)
            return device.split(":")[0] if isinstance(device, str) else UNKNOWN
        if not isinstance(node.value, ast.Name) or node.value.id == "self":
            return UNKNOWN
        qualified = self.qualified(node, scope)
        if qualified is not None:  # a module's attribute: torch.float64 and the like
            return ENVIRON if qualified == "os.environ" else UNKNOWN
        assigned = self._attributes.get(node.attr, [])
        if len(assigned) == 1:
            value = self.possible(assigned[0], scope)
            if value is not UNKNOWN or node.attr not in self._options:
                return value
        elif assigned:
            return UNKNOWN
        return self._options.get(node.attr, UNKNOWN)  # the option's default

    def _bool_op(self, node: ast.BoolOp, scope) -> object:
        deciding = isinstance(node.op, ast.Or)  # the value that ends the chain
        result: object = not deciding
        for operand in node.values:
            value = self.possible(operand, scope)
            if truth(value) is not UNKNOWN and truth(value) == deciding:
                return value
            if truth(value) is UNKNOWN:
                result = UNKNOWN
            elif result is not UNKNOWN:
                result = value
        return result

    def _call(self, node: ast.Call, scope) -> object:
        name = self.qualified(node.func, scope)
        if name in _QUERIES:
            return _QUERIES[name](self.target)
        func = node.func
        if node.args and (
            name in _ENVIRONMENT_READS
            or isinstance(func, ast.Attribute)
            and func.attr == "get"
            and self.possible(func.value, scope) is ENVIRON
        ):
            return self._read(node.args[0], node.args[1] if len(node.args) > 1 else _NONE, scope)
        if (
            name is None
            and isinstance(func, ast.Name)
            and func.id in _CONVERSIONS
            and len(node.args) == 1
        ):
            return _converted(_CONVERSIONS[func.id], self.possible(node.args[0], scope))
        if name == "torch.device" and node.args:
            first = self.possible(node.args[0], scope)
            return first if isinstance(first, str) else UNKNOWN
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "format"
            and isinstance(func.value, ast.Constant)
            and isinstance(func.value.value, str)
        ):  # "cuda:{}".format(rank)
            return Prefix(func.value.value.split("{")[0])
        return UNKNOWN

    def _read(self, key: ast.expr, default: ast.expr | None, scope) -> object:
        """os.environ[key] (default None), os.environ.get(key, default), os.getenv(key, default)."""
        seen = self.environment.seen(settled(self.possible(key, scope)), read_at(key, scope))
        if seen is None or seen.present and seen.values is None:
            return UNKNOWN
        if not seen.present:  # without a default, a KeyError (walk.raises says so)
            return UNKNOWN if default is None else self.possible(default, scope)
        return seen.values[0] if len(seen.values) == 1 else Among(seen.values)

    def qualified(self, node: ast.AST, scope) -> str | None:
        facts = getattr(scope, "facts", None) or self.project.facts[0]
        return facts.qualified(node)

    # ------------------------------------------------------------ conditions

    def test(self, node: ast.expr, scope) -> tuple[object, str | None]:
        """(value, what it reads) of a condition: "device" when it reads the device or its
        availability, "gpu" when it reads a GPU option (`args.gpu is None`, at its default),
        "environment" when it reads os.environ (the launcher's variables are the plan's), else
        None (and then the value, which decides nothing, is not worked out)."""
        reads = self.reads(node, scope)
        return (UNKNOWN if reads is None else self.value(node, scope)), reads

    def reads(self, node: ast.expr, scope, depth: int = 0) -> str | None:
        """What a condition reads, directly or through a name bound (once) from a reading."""
        found = None
        for child in ast.walk(node):
            if isinstance(child, ast.Call) and self.qualified(child.func, scope) in _QUERIES:
                return "device"
            word = (
                child.id
                if isinstance(child, ast.Name)
                else child.attr
                if isinstance(child, ast.Attribute)
                else None
            )
            if word is None:
                continue
            parts = _PARTS.findall(word.lower())
            if word in ("type", "is_cuda", "is_mps") or any(
                part in _DEVICE_PARTS for part in parts
            ):
                return "device"
            if any(part in _GPU_PARTS for part in parts):
                found = "gpu"
            if word in ("environ", "getenv") and self.qualified(child, scope) in (
                "os.environ",
                "os.getenv",
            ):
                found = found or "environment"
            if (
                isinstance(child, ast.Name)
                and depth < 3
                and scope is not None
                and (
                    child.id in scope.facts.device_names
                    or child.id in scope.facts.environment_names
                )
            ):
                bound, where = scope.lookup(child.id)
                if isinstance(bound, ast.expr):
                    found = self.reads(bound, where, depth + 1) or found
                    if found == "device":
                        return found
        return found


def read_at(node: ast.AST, scope) -> tuple[str, int]:
    """Where a variable is read: (file, line)."""
    facts = getattr(scope, "facts", None)
    return (str(facts.source.path) if facts else "", getattr(node, "lineno", 0))


class Prefix(str):
    """An f-string known by its start: f"cuda:{rank}" is Prefix("cuda:")."""


class Among(tuple):
    """A value that differs between the plan's processes: each one it can be (RANK on several)."""


def settled(value: object) -> object:
    """One value for all the plan's processes, or UNKNOWN."""
    if isinstance(value, Among):
        return value[0] if len(set(value)) == 1 else UNKNOWN
    return value


def truth(value: object) -> object:
    """True or False when the value is, on every process of the plan; else UNKNOWN."""
    if value is UNKNOWN or value is ENVIRON:
        return UNKNOWN
    if isinstance(value, Among):
        answers = {bool(one) for one in value}
        return answers.pop() if len(answers) == 1 else UNKNOWN
    return bool(value)


def _converted(convert, value: object) -> object:
    """int(value), str(value): for each value of Among; UNKNOWN where it would raise."""
    if value is UNKNOWN or value is ENVIRON or isinstance(value, Prefix):
        return UNKNOWN
    try:
        return Among(convert(one) for one in value) if isinstance(value, Among) else convert(value)
    except (TypeError, ValueError):
        return UNKNOWN


def _compare(op: ast.cmpop, left: Any, right: Any) -> object:
    """The comparison of two of the script's values; a TypeError where the script's would fail."""
    if isinstance(left, Among) or isinstance(right, Among):
        answers = {
            _compare(op, one, other)
            for one in (left if isinstance(left, Among) else (left,))
            for other in (right if isinstance(right, Among) else (right,))
        }
        return answers.pop() if len(answers) == 1 else UNKNOWN
    if (
        left is UNKNOWN
        or right is UNKNOWN
        or isinstance(left, Prefix)
        or isinstance(right, Prefix)
        or left is ENVIRON
        or right is ENVIRON
    ):
        return UNKNOWN
    operations = {
        ast.Eq: lambda: left == right,
        ast.NotEq: lambda: left != right,
        ast.Is: lambda: left is right,
        ast.IsNot: lambda: left is not right,
        ast.In: lambda: left in right,
        ast.NotIn: lambda: left not in right,
        ast.Gt: lambda: left > right,
        ast.GtE: lambda: left >= right,
        ast.Lt: lambda: left < right,
        ast.LtE: lambda: left <= right,
    }
    operation = operations.get(type(op))
    return UNKNOWN if operation is None else operation()


def _option(call: ast.Call) -> tuple[str | None, object]:
    """(dest, default) of parser.add_argument(...)."""
    names = [
        arg.value
        for arg in call.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    ]
    keywords = {keyword.arg: keyword.value for keyword in call.keywords if keyword.arg}
    dest_node = keywords.get("dest")
    if isinstance(dest_node, ast.Constant) and isinstance(dest_node.value, str):
        dest: str | None = dest_node.value
    else:
        long = [name for name in names if name.startswith("--")] or names
        dest = long[0].lstrip("-").replace("-", "_") if long else None
    action_node = keywords.get("action")
    action = action_node.value if isinstance(action_node, ast.Constant) else ""
    if not isinstance(action, str):
        action = ""
    if "required" in keywords and getattr(keywords["required"], "value", False) is True:
        return dest, UNKNOWN
    if "default" in keywords:
        default = keywords["default"]
        return dest, default.value if isinstance(default, ast.Constant) else UNKNOWN
    return dest, {"store_true": False, "store_false": True}.get(action)


def is_cuda_text(value: object) -> bool:
    return isinstance(value, str) and (value == "cuda" or value.startswith("cuda:"))
