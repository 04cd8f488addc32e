"""Devices a script chooses for itself: the silent CPU fall-back, and cuda as a default.

`device = "cuda" if torch.cuda.is_available() else "cpu"` runs on a Mac without an error, on
the CPU, while the plan says mps: one finding at the choice (mps plan). The same holds for a
flag (`cuda = torch.cuda.is_available()`, then `if cuda: model.cuda()`), reported once at the
flag. An option whose default is "cuda" (`--device`) is reported at the default (mps and cpu
plans), as is a module-level `device = "cuda"` that only a config file run by exec() may change
(devices.py).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from mpslaunch.check.registry import Check, implements
from mpslaunch.check.scan import Where
from mpslaunch.check.values import CUDA_TENSOR, UNKNOWN, is_cuda_text

_CUDA_QUERIES = ("torch.cuda.is_available", "torch.cuda.device_count")


@implements("cpu-fallback")
class Choices(Check):
    """The fall-back sites seen in a walk, one finding per choice (or per flag)."""

    def __init__(self, rules, rule) -> None:
        super().__init__(rules, rule)
        self.sites: dict[
            tuple[object, ...], tuple[Where, ast.stmt | ast.expr, str]
        ] = {}  # key -> first site
        self.explicit_origins: set[object] = set()
        self.not_devices: set[int] = set()  # choices of a device type for autocast and the like

    def call(self, call: ast.Call, where: Where, name: str | None, qualified: str | None) -> None:
        """Notes the `"cuda" if ... else "cpu"` given to a torch call that does not place work
        (autocast(device_type=...), GradScaler, init_process_group): not a device choice."""
        placing = qualified in (
            None,
            "torch.device",
            "torch.set_default_device",
        ) or not qualified.startswith("torch.")
        for keyword in call.keywords:
            if isinstance(keyword.value, ast.IfExp) and (
                not placing or keyword.arg in ("device_type", "backend")
            ):
                self.not_devices.add(id(keyword.value))
        if not placing:
            self.not_devices.update(id(arg) for arg in call.args if isinstance(arg, ast.IfExp))

    def branch(self, node: ast.If | ast.IfExp | ast.While, where: Where) -> None:
        if where.device_unknown or isinstance(node, ast.While):
            return
        origin = self.origin(node.test, where)
        if origin is None:
            return
        value, _ = where.values.test(node.test, where.scope)
        cuda_side, cpu_side = _device_side(node, "cuda"), _device_side(node, "cpu")
        if cuda_side is not None and cpu_side is not None and cuda_side != cpu_side:
            # "cuda" if test else "cpu": a fall-back unless the test holds here (then cuda-device)
            cuda_here = value is not UNKNOWN and bool(value) == (cuda_side == "body")
            if id(node) not in self.not_devices and not _mentions_mps(node) and not cuda_here:
                self.explicit_origins.add(origin[0])
                self.sites[("explicit", id(node))] = (where, node, _shown(node))
            return
        if value is UNKNOWN or self.rules.project.mentions_mps:
            return
        skipped = node.orelse if value else node.body
        if _places_on_cuda(skipped if isinstance(skipped, list) else [skipped]):
            key, line_node, shown = origin
            if key not in self.sites or self.sites[key][1].lineno > line_node.lineno:
                self.sites[key] = (where, line_node, shown)

    def origin(
        self, test: ast.expr, where: Where
    ) -> tuple[tuple[object, ...], ast.expr, str] | None:
        """What a test about CUDA rests on, the node to report and how to show it: the query
        itself, a flag bound from it (at its binding), or an option named for cuda; None for a
        test of anything else."""
        values = where.values
        for child in ast.walk(test):
            if (
                isinstance(child, ast.Call)
                and values.qualified(child.func, where.scope) in _CUDA_QUERIES
            ):
                return ("direct", where.facts.source.path), test, _shown(test)
            if isinstance(child, ast.Attribute) and child.attr.lower() in ("cuda", "use_cuda"):
                return ("option", child.attr), test, _shown(test)
            if not isinstance(child, ast.Name) or child.id not in where.facts.device_names:
                continue
            bound, scope = where.scope.lookup(child.id)
            if (
                isinstance(bound, ast.expr)
                and not _is_device_value(bound)
                and (
                    "cuda" in child.id.lower()
                    or any(
                        isinstance(n, ast.Call) and values.qualified(n.func, scope) in _CUDA_QUERIES
                        for n in ast.walk(bound)
                    )
                )
            ):
                return ("flag", id(bound)), bound, f"{child.id} = {_shown(bound)}"
        return None

    def finish(self) -> None:
        """Adds one finding per choice; a flag that also makes an explicit choice is reported
        there only."""
        rebound = _rebound_module_names(self.sites.values())
        for key, (where, node, shown) in sorted(
            self.sites.items(), key=lambda item: item[1][1].lineno
        ):
            if key[0] == "flag" and key in self.explicit_origins or id(node) in rebound:
                continue
            self.rules.add(
                where,
                node,
                "cpu-fallback",
                "choice",
                "accelerate" if self.rules.uses_accelerate else "plain",
                shown=shown,
            )
        self.sites.clear()


def _rebound_module_names(sites) -> set[int]:
    """The choices bound at module level to a name that a later module-level choice (in the
    main block, say) binds again before anything runs: only the last one counts."""
    by_name: dict[tuple[str, str], list[ast.stmt | ast.expr]] = {}
    for where, node, _ in sites:
        if where.scope.function is None:
            name = _module_target(where.facts.source.tree.body, node)
            if name:
                by_name.setdefault((where.facts.source.shown, name), []).append(node)
    return {
        id(node)
        for nodes in by_name.values()
        for node in sorted(nodes, key=lambda n: n.lineno)[:-1]
    }


def _module_target(body: list[ast.stmt], node: ast.stmt | ast.expr) -> str | None:
    """The name a module-level (or main block) `name = ...` that holds node binds."""
    for statement in body:
        end = statement.end_lineno or statement.lineno
        if isinstance(statement, ast.If) and statement.lineno <= node.lineno <= end:
            return _module_target(statement.body, node)
        if (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
            and statement.lineno <= node.lineno <= end
        ):
            return statement.targets[0].id
    return None


@implements("cuda-default")
def option_default(
    rules, call: ast.Call, where: Where, name: str | None, qualified: str | None
) -> None:
    """`parser.add_argument("--device", default="cuda")`."""
    default = next((k.value for k in call.keywords if k.arg == "default"), None)
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if (
        not isinstance(default, ast.Constant)
        or not is_cuda_text(default.value)
        or where.device_unknown
        or not any("device" in name.lower() for name in names)
    ):
        return
    option = next((name for name in names if name.startswith("--")), names[0])
    rules.add(where, call, "cuda-default", "option", option=option, value=default.value)


def _device_side(node: ast.AST, kind: str) -> str | None:
    """Which side ("body" or "orelse") of an if or conditional expression chooses this device."""
    for side in ("body", "orelse"):
        part = getattr(node, side)
        expressions = (
            [part]
            if isinstance(part, ast.expr)
            else [
                s.value for s in part if isinstance(s, ast.Assign) and isinstance(s.value, ast.expr)
            ]
        )
        if any(_device_kind(expression) == kind for expression in expressions):
            return side
    return None


def _device_kind(node: ast.expr) -> str | None:
    """ "cuda", "cpu" or "mps" for a device written out: "cuda:0", torch.device("cpu"), f"cuda:{i}"."""
    if (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "device"
        and node.args
    ):
        node = node.args[0]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
    ):
        node = node.func.value
    if isinstance(node, ast.JoinedStr) and node.values:
        node = node.values[0]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        kind = node.value.split(":")[0]
        return kind if kind in ("cuda", "cpu", "mps") else None
    return None


def _is_device_value(node: ast.expr) -> bool:
    if isinstance(node, ast.IfExp):
        return _is_device_value(node.body) or _is_device_value(node.orelse)
    return _device_kind(node) is not None


def _mentions_mps(node: ast.AST) -> bool:
    return any(
        isinstance(child, ast.Constant)
        and child.value == "mps"
        or isinstance(child, ast.Attribute)
        and child.attr == "mps"
        for child in ast.walk(node)
    )


def _places_on_cuda(statements: Iterable[ast.AST]) -> bool:
    """Whether code puts work on cuda: .cuda(), a cuda device written out, torch.cuda.XTensor."""
    for statement in statements:
        for child in ast.walk(statement):
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and child.func.attr == "cuda"
            ):
                return True
            if isinstance(child, ast.expr) and _device_kind(child) == "cuda":
                return True
            if isinstance(child, ast.Attribute) and CUDA_TENSOR.match(ast.unparse(child)):
                return True
    return False


def _shown(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 70 else text[:67] + "..."
