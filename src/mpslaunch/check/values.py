"""What an expression is on the plan, as far as the source tells: the answers of
`torch.cuda.is_available()` and its kin on that machine, literals, names bound once, the
defaults of the script's argparse options, and what `and`, `not`, `==` and `x if c else y`
make of them.

A script is judged as it runs when nothing is passed: an option stands for its default. A
condition is a device test when it reads the device or its availability (directly or through
a name bound from one); a device test whose value cannot be told hides both its branches,
and any other condition (a rank, the main process, a precision flag) hides nothing.
"""

from __future__ import annotations

import ast
import re
from functools import cached_property

UNKNOWN = type("Unknown", (), {"__repr__": lambda self: "UNKNOWN"})()
_DEPTH = 12  # names bound to names: deeper than this is unknown (and cycles end)
_PARTS = re.compile(r"[a-z]+")
_DEVICE_PARTS = ("cuda", "device", "devices", "mps")  # a name whose value, unknown, reads the device
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
    "torch.accelerator.current_accelerator": lambda t: (t.device if t.device == "cuda" else
                                                        "mps" if t.system == "Darwin" else None),
}


class Values:
    """Evaluates expressions of the project's files on one target."""

    def __init__(self, target, project):
        self.target, self.project = target, project
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
                    settled.update((k.arg, k.value.value if isinstance(k.value, ast.Constant) else UNKNOWN)
                                   for k in call.keywords if k.arg)
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
        """The value of node on the target, or UNKNOWN."""
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
        kind = type(node)
        if kind is ast.Constant:
            return node.value
        if kind is ast.Name:
            bound, where = scope.lookup(node.id) if scope is not None else (None, None)
            return self.value(bound, where) if isinstance(bound, ast.expr) else UNKNOWN
        if kind is ast.Attribute:
            return self._attribute(node, scope)
        if kind is ast.UnaryOp and isinstance(node.op, ast.Not):
            operand = self.value(node.operand, scope)
            return UNKNOWN if operand is UNKNOWN else not operand
        if kind is ast.BoolOp:
            return self._bool_op(node, scope)
        if kind is ast.Compare and len(node.ops) == 1:
            return _compare(node.ops[0], self.value(node.left, scope), self.value(node.comparators[0], scope))
        if kind is ast.IfExp:
            test = self.value(node.test, scope)
            return UNKNOWN if test is UNKNOWN else self.value(node.body if test else node.orelse, scope)
        if kind is ast.Call:
            return self._call(node, scope)
        if kind is ast.JoinedStr and node.values and isinstance(node.values[0], ast.Constant):
            return Prefix(str(node.values[0].value))
        return UNKNOWN

    def _attribute(self, node: ast.Attribute, scope) -> object:
        if node.attr == "type":  # device.type
            device = self.value(node.value, scope)
            return device.split(":")[0] if isinstance(device, str) else UNKNOWN
        if not isinstance(node.value, ast.Name) or node.value.id == "self":
            return UNKNOWN
        if self.qualified(node, scope) is not None:
            return UNKNOWN  # a module's attribute: torch.float64 and the like
        assigned = self._attributes.get(node.attr, [])
        if len(assigned) == 1:
            value = self.value(assigned[0], scope)
            if value is not UNKNOWN or node.attr not in self._options:
                return value
        elif assigned:
            return UNKNOWN
        return self._options.get(node.attr, UNKNOWN)  # the option's default

    def _bool_op(self, node: ast.BoolOp, scope) -> object:
        deciding = isinstance(node.op, ast.Or)  # the value that ends the chain
        result: object = not deciding
        for operand in node.values:
            value = self.value(operand, scope)
            if value is not UNKNOWN and bool(value) == deciding:
                return value
            if value is UNKNOWN:
                result = UNKNOWN
            elif result is not UNKNOWN:
                result = value
        return result

    def _call(self, node: ast.Call, scope) -> object:
        name = self.qualified(node.func, scope)
        if name in _QUERIES:
            return _QUERIES[name](self.target)
        if name == "torch.device" and node.args:
            first = self.value(node.args[0], scope)
            return first if isinstance(first, str) else UNKNOWN
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "format" and isinstance(func.value, ast.Constant) \
                and isinstance(func.value.value, str):  # "cuda:{}".format(rank)
            return Prefix(func.value.value.split("{")[0])
        return UNKNOWN

    def qualified(self, node: ast.AST, scope) -> str | None:
        facts = getattr(scope, "facts", None) or self.project.facts[0]
        return facts.qualified(node)

    # ------------------------------------------------------------ conditions

    def test(self, node: ast.expr, scope) -> tuple[object, str | None]:
        """(value, what it reads) of a condition: "device" when it reads the device or its
        availability, "gpu" when it reads a GPU option (`args.gpu is None`), else None (and
        then the value, which decides nothing, is not worked out)."""
        reads = self.reads(node, scope)
        return (UNKNOWN if reads is None else self.value(node, scope)), reads

    def reads(self, node: ast.expr, scope, depth: int = 0) -> str | None:
        """What a condition reads, directly or through a name bound (once) from a reading."""
        found = None
        for child in ast.walk(node):
            if isinstance(child, ast.Call) and self.qualified(child.func, scope) in _QUERIES:
                return "device"
            word = child.id if isinstance(child, ast.Name) else \
                child.attr if isinstance(child, ast.Attribute) else None
            if word is None:
                continue
            parts = _PARTS.findall(word.lower())
            if word in ("type", "is_cuda", "is_mps") or any(part in _DEVICE_PARTS for part in parts):
                return "device"
            if any(part in _GPU_PARTS for part in parts):
                found = "gpu"
            if isinstance(child, ast.Name) and depth < 3 and scope is not None \
                    and child.id in scope.facts.device_names:
                bound, where = scope.lookup(child.id)
                if isinstance(bound, ast.expr):
                    found = self.reads(bound, where, depth + 1) or found
                    if found == "device":
                        return found
        return found


class Prefix(str):
    """An f-string known by its start: f"cuda:{rank}" is Prefix("cuda:")."""


def _compare(op: ast.cmpop, left: object, right: object) -> object:
    if left is UNKNOWN or right is UNKNOWN or isinstance(left, Prefix) or isinstance(right, Prefix):
        return UNKNOWN
    operations = {ast.Eq: lambda: left == right, ast.NotEq: lambda: left != right,
                  ast.Is: lambda: left is right, ast.IsNot: lambda: left is not right,
                  ast.In: lambda: left in right, ast.NotIn: lambda: left not in right,
                  ast.Gt: lambda: left > right, ast.GtE: lambda: left >= right,
                  ast.Lt: lambda: left < right, ast.LtE: lambda: left <= right}
    operation = operations.get(type(op))
    return UNKNOWN if operation is None else operation()


def _option(call: ast.Call) -> tuple[str | None, object]:
    """(dest, default) of parser.add_argument(...)."""
    names = [arg.value for arg in call.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    keywords = {keyword.arg: keyword.value for keyword in call.keywords if keyword.arg}
    if "dest" in keywords and isinstance(keywords["dest"], ast.Constant):
        dest = keywords["dest"].value
    else:
        long = [name for name in names if name.startswith("--")] or names
        dest = long[0].lstrip("-").replace("-", "_") if long else None
    action = keywords.get("action")
    action = action.value if isinstance(action, ast.Constant) else None
    if "required" in keywords and getattr(keywords["required"], "value", False) is True:
        return dest, UNKNOWN
    if "default" in keywords:
        default = keywords["default"]
        return dest, default.value if isinstance(default, ast.Constant) else UNKNOWN
    return dest, {"store_true": False, "store_false": True}.get(action)


def is_cuda_text(value: object) -> bool:
    return isinstance(value, str) and (value == "cuda" or value.startswith("cuda:"))
