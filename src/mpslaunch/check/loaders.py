"""The DataLoader rules: pin_memory on mps, and workers that a Mac starts by spawn (which run
the script again, and pickle what they are given).

A loader's arguments are read where they are written: keywords, positions, and the dicts
passed as `**kwargs` (`loader_args = dict(pin_memory=True)`, `kwargs.update({...})` in a branch
the plan takes).
"""

from __future__ import annotations

import ast

from mpslaunch.check.registry import implements
from mpslaunch.check.scan import FUNCTION_NODES, Where
from mpslaunch.check.values import UNKNOWN
from mpslaunch.check.walk import has_main_guard

DATALOADER = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
# DataLoader's positional parameters, in order.
LOADER_PARAMETERS = (
    "dataset",
    "batch_size",
    "shuffle",
    "sampler",
    "batch_sampler",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
)
# Calls that keep the transforms they are given (so a lambda inside is pickled with the dataset).
TRANSFORM_HOLDERS = {
    "Compose",
    "Lambda",
    "RandomApply",
    "RandomChoice",
    "RandomOrder",
    "partial",
    "Sequential",
}


@implements("pin-memory-mps")
def pin_memory(
    rules, call: ast.Call, where: Where, name: str | None, qualified: str | None
) -> None:
    if (
        qualified in DATALOADER
        and not where.device_unknown
        and where.value(Arguments(call, where).get("pin_memory")) is True
    ):
        rules.add(where, call, "pin-memory-mps", "pin")


@implements("workers-main-guard")
def main_guard(
    rules, call: ast.Call, where: Where, name: str | None, qualified: str | None
) -> None:
    source = where.facts.source
    if (
        qualified in DATALOADER
        and source.is_script
        and where.at_import
        and not has_main_guard(source.tree)
    ):
        started = _started(rules, Arguments(call, where), where)
        if started:
            rules.add(where, call, "workers-main-guard", "guard", started=started)


@implements("workers-pickle")
def pickled(rules, call: ast.Call, where: Where, name: str | None, qualified: str | None) -> None:
    if qualified not in DATALOADER:
        return
    arguments = Arguments(call, where)
    found = [
        ("callable", {"part": part, "what": unpicklable(arguments.get(part), where)})
        for part in ("collate_fn", "worker_init_fn")
    ]
    found.append(("dataset", {"what": dataset_unpicklable(arguments.get("dataset"), where)}))
    found = [(kind, fields) for kind, fields in found if fields["what"]]
    started = (
        _started(rules, arguments, where) if found else None
    )  # how many workers: only if it matters
    if not started:
        return
    # a spawned worker finds a function by its module: a notebook's own functions have none
    home = (
        "in a .py module beside the notebook, and import it"
        if where.facts.source.cells is not None
        else "with def at module level"
    )
    for kind, fields in found:
        rules.add(where, call, "workers-pickle", kind, started=started, home=home, **fields)


def _started(rules, arguments: Arguments, where: Where) -> str | None:
    """How the loader's workers start ("workers (num_workers=4) start by spawn on macOS"), or
    None when it starts none or starts them by fork (which pickles nothing, runs nothing again)."""
    workers = _workers(arguments.get("num_workers"), where)
    method = _start_method(arguments.get("multiprocessing_context"), rules, where)
    if workers is None or method == "fork":
        return None
    return f"workers ({workers}) start by {method} {rules.target.where}"


class Arguments:
    """A DataLoader call's arguments: by keyword, by position (not after a *args), or from
    the dicts passed as **kwargs."""

    def __init__(self, call: ast.Call, where: Where):
        self.call, self.where = call, where
        self._spread: dict[str, ast.expr] | None = None

    def get(self, name: str) -> ast.expr | None:
        for keyword in self.call.keywords:
            if keyword.arg == name:
                return keyword.value
        position = LOADER_PARAMETERS.index(name)
        if len(self.call.args) > position and not any(
            isinstance(arg, ast.Starred) for arg in self.call.args[: position + 1]
        ):
            return self.call.args[position]
        if self._spread is None:
            self._spread = {}
            for keyword in self.call.keywords:
                if keyword.arg is None:
                    self._spread.update(dict_items(keyword.value, self.where))
        return self._spread.get(name)


def dict_items(node: ast.expr | None, where: Where, depth: int = 0) -> dict[str, ast.expr]:
    """What a dict holds on the plan: a literal, dict(...), a name bound once to one (and what
    the scope's `name.update(...)` calls add in the branches the plan takes), or the branch
    of `a if test else b` the plan takes."""
    if depth > 4 or node is None:
        return {}
    if isinstance(node, ast.Dict):
        return {
            key.value: value
            for key, value in zip(node.keys, node.values, strict=True)
            if isinstance(key, ast.Constant) and isinstance(key.value, str)
        }
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
        return {k.arg: k.value for k in node.keywords if k.arg}
    if isinstance(node, ast.IfExp):
        test = where.value(node.test)
        return (
            {}
            if test is UNKNOWN
            else dict_items(node.body if test else node.orelse, where, depth + 1)
        )
    if isinstance(node, ast.Name):
        bound, scope = where.scope.lookup(node.id)
        if not isinstance(bound, ast.expr) or scope is None:
            return {}
        items = dict_items(bound, where, depth + 1)
        for update in _updates(scope.body, node.id, where):
            items.update({k.arg: k.value for k in update.keywords if k.arg})
            if update.args:
                items.update(dict_items(update.args[0], where, depth + 1))
        return items
    return {}


def _updates(body: list[ast.stmt], name: str, where: Where) -> list[ast.Call]:
    """`name.update(...)` calls in a body (not in nested functions), in the branches the plan
    takes."""
    found = []
    for statement in body:
        if isinstance(statement, (*FUNCTION_NODES, ast.ClassDef)):
            continue
        if isinstance(statement, ast.If):
            value, reads = where.values.test(statement.test, where.scope)
            if value is UNKNOWN and reads == "device":
                continue
            taken = (
                [statement.body, statement.orelse]
                if value is UNKNOWN or reads is None
                else [statement.body if value else statement.orelse]
            )
            for part in taken:
                found += _updates(part, name, where)
            continue
        call = statement.value if isinstance(statement, ast.Expr) else None
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "update"
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == name
        ):
            found.append(call)
        for field in ("body", "orelse", "finalbody"):
            if isinstance(getattr(statement, field, None), list):
                found += _updates(getattr(statement, field), name, where)
    return found


def _workers(node: ast.expr | None, where: Where) -> str | None:
    """'num_workers=4' (or the expression: workers unless it is 0 at run time) when the
    loader starts workers; None when it does not: 0 written, or an option whose default is 0."""
    if node is None:
        return None
    known = where.literal(node)
    if known is not None:
        value = known[0]
        return f"num_workers={value}" if isinstance(value, int) and value > 0 else None
    if type(where.value(node)) is int and where.value(node) == 0:  # an option at its default
        return None
    return f"num_workers={ast.unparse(node)}"


def _start_method(context: ast.expr | None, rules, where: Where) -> str:
    if context is not None:
        if isinstance(context, ast.Call) and _name(context) == "get_context" and context.args:
            context = context.args[0]
        known = where.literal(context)
        return str(known[0]) if known else "fork"  # an unknown context: say nothing
    return where.facts.start_method or rules.target.start_method


def _name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def unpicklable(node: ast.expr | None, where: Where) -> str | None:
    """What makes a callable unpicklable by name: a lambda, or a def inside a function."""
    if isinstance(node, ast.Lambda):
        return "a lambda"
    if isinstance(node, ast.Call) and _name(node) == "partial" and node.args:
        return unpicklable(node.args[0], where)
    if isinstance(node, ast.Name):
        value, scope = where.scope.lookup(node.id)
        if isinstance(value, ast.Lambda):
            return f"{node.id}, a lambda (line {value.lineno})"
        if isinstance(value, FUNCTION_NODES) and scope is not None and scope.function is not None:
            return f"{node.id}, a function defined inside {scope.name}() (line {value.lineno})"
    return None


def dataset_unpicklable(node: ast.expr | None, where: Where) -> str | None:
    """A lambda or local function among the transforms the dataset is built with, or one its
    class stores on self."""
    if isinstance(node, ast.Name):
        bound, _ = where.scope.lookup(node.id)
        node = bound if isinstance(bound, ast.Call) else None
    if not isinstance(node, ast.Call):
        return None
    for keyword in node.keywords:
        if keyword.arg and "transform" in keyword.arg:
            found = _in_transforms(keyword.value, where)
            if found:
                return f"{found} in {keyword.arg}"
    for argument in node.args:
        if isinstance(argument, ast.Call) and _name(argument) in TRANSFORM_HOLDERS:
            found = _in_transforms(argument, where)
            if found:
                return found
    if isinstance(node.func, ast.Name):
        cls, _ = where.scope.lookup(node.func.id)
        if isinstance(cls, ast.ClassDef) and where.facts.may_hold_a_lambda(cls):
            return _stored_lambda(cls)
    return None


def _in_transforms(node: ast.expr, where: Where, depth: int = 0) -> str | None:
    found = unpicklable(node, where)
    if found or depth > 8:
        return found
    if isinstance(node, ast.Name):  # a transform built on an earlier line
        value, _ = where.scope.lookup(node.id)
        return _in_transforms(value, where, depth + 1) if isinstance(value, ast.expr) else None
    if isinstance(node, (ast.List, ast.Tuple)):
        children = node.elts
    elif isinstance(node, ast.Call) and _name(node) in TRANSFORM_HOLDERS:
        children = [*node.args, *(keyword.value for keyword in node.keywords)]
    else:
        return None
    for child in children:
        found = _in_transforms(child, where, depth + 1)
        if found:
            return found
    return None


def _stored_lambda(cls: ast.ClassDef) -> str | None:
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    return f"a lambda as self.{target.attr} (line {node.lineno})"
    return None
