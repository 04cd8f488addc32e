"""How a script writes a device: "cuda:0", f"cuda:{rank}", a name bound once to one, a choice
that the plan settles, a module-level default that exec() may rebind (reported once, at its
line, under cuda-default), and whether an expression is a device that is not the CPU."""

from __future__ import annotations

import ast

from mpslaunch.check.calls import called_name, keyword_value
from mpslaunch.check.scan import Scope, Where
from mpslaunch.check.values import CUDA_TENSOR, Prefix, is_cuda_text

CUDA_AUTOCAST = {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
CUDA_SCALER = {"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"}
AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"}
SCALER = {"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler"}
# Methods whose device= places a tensor or a module.
TENSOR_METHODS = ("to", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "to_empty")
__all__ = ["CUDA_TENSOR", "cuda_argument", "cuda_text", "is_device_expression", "takes_a_device"]


def cuda_argument(rules, node: ast.expr | None, shown: str, where: Where) -> str | None:
    """`.to("cuda:0")` (or `.to(device)` with the line that binds device to "cuda") when node
    is a cuda device; None otherwise."""
    text = cuda_text(rules, node, where)
    if text is None:
        return None
    what = f"{shown}{text}" if shown.endswith("=") else f"{shown}({text})"
    return f"{what}, cuda unless an option says otherwise," if isinstance(node, ast.IfExp) else what


def cuda_text(rules, node: ast.expr | None, where: Where) -> str | None:
    """How to show node when it names a cuda device: a literal, f"cuda:{rank}", a name bound
    once to one, or `"cuda" if test else "cpu"` where the test holds on the plan. A module-level
    default that exec() may rebind is reported once at its line instead."""
    if isinstance(node, ast.Name) and module_default(rules, node, where):
        return None
    known = where.literal(node)
    if known is not None:
        value, line = known
        if not is_cuda_text(value):
            return None
        if line is None or not isinstance(node, ast.Name):  # a line: a name bound to the literal
            return f'"{value}"'
        return f'{node.id} (= "{value}", line {line})'
    if isinstance(node, ast.Name):
        if node.id not in where.facts.cuda_names:
            return None
        bound, _ = where.scope.lookup(node.id)
        if not isinstance(bound, (ast.JoinedStr, ast.Call)) or bound.lineno == node.lineno:
            return None
        value = where.value(node)
        return (
            f"{node.id} (= {ast.unparse(bound)}, line {bound.lineno})"
            if isinstance(value, Prefix) and value.startswith("cuda")
            else None
        )
    value = where.value(node) if isinstance(node, (ast.IfExp, ast.JoinedStr, ast.Call)) else None
    if isinstance(value, Prefix) and value.startswith("cuda"):
        return f'f"{value}..."'
    if isinstance(node, ast.IfExp) and is_cuda_text(value):
        return ast.unparse(node)
    return None


def module_default(rules, name: ast.Name, where: Where) -> bool:
    """A module-level `device = "cuda"` in a file that exec() or globals() may rebind, used as a
    device here: reported once at its line. Whether name is such a default."""
    if where.facts.constants_trusted or name.id not in where.facts.literal_names:
        return False
    scope: Scope | None = where.scope
    while scope is not None and name.id not in scope.bindings:
        scope = scope.parent
    if scope is None or scope.function is not None:
        return False  # a local name
    for statement in where.facts.source.tree.body:
        if (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and getattr(statement.targets[0], "id", None) == name.id
            and isinstance(statement.value, ast.Constant)
            and is_cuda_text(statement.value.value)
        ):
            rules.add(
                where,
                statement,
                "cuda-default",
                "module",
                name=name.id,
                value=statement.value.value,
            )
            return True
    return False


def takes_a_device(call: ast.Call, name: str | None, qualified: str | None) -> bool:
    """Whether `device=` of this call places tensors or a model: torch's own functions and
    classes, a tensor's or module's methods, a Hugging Face pipeline (not `dict(device=...)`)."""
    if qualified is None:
        return isinstance(call.func, ast.Attribute) and name in TENSOR_METHODS
    return qualified.startswith(("torch.", "torchvision.", "transformers.")) and qualified not in (
        *CUDA_SCALER,
        *SCALER,
        *CUDA_AUTOCAST,
        *AUTOCAST,
    )


def is_device_expression(node: ast.expr, where: Where) -> bool:
    """A device that is not the CPU on the plan: "mps", or a name or attribute called device
    (unless the plan makes it the CPU: a device chosen as `"cuda" if ... else "cpu"`)."""
    known = where.literal(node)
    if known is not None:
        return known[0] == "mps"
    value = where.value(node)
    if isinstance(value, str):
        return value.split(":")[0] != "cpu"
    if isinstance(node, ast.Name):
        return "device" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "device" in node.attr.lower()
    if isinstance(node, ast.Call) and where.facts.qualified(node.func) == "torch.device":
        first = where.literal(node.args[0]) if node.args else None
        return first is None or first[0] != "cpu"
    return False


def moves_to_device(call: ast.Call, where: Where) -> bool:
    """A device that is not the CPU among the call's device= (or .to's first argument)."""
    candidates = [keyword_value(call, "device")]
    if called_name(call) == "to" and where.facts.qualified(call.func) is None:
        candidates += call.args[:1]
    return any(is_device_expression(node, where) for node in candidates if node is not None)
