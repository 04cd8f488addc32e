"""The rules about cuda written into a script: work put on cuda, checkpoints loaded onto it,
and nccl process groups on a plan without NVIDIA GPUs.

A rule speaks only when it is sure: about literals (and names bound once to one), about what
values.py can tell of an expression on the plan, never in a branch a device test rules out or
under one whose answer is unknown (walk.py), and never inside a try that catches the error.
"""

from __future__ import annotations

import ast
import re

from mpslaunch.check.calls import argument
from mpslaunch.check.devices import (
    CUDA_TENSOR,
    cuda_argument,
    cuda_text,
    takes_a_device,
)
from mpslaunch.check.registry import implements
from mpslaunch.check.scan import Where

# torch.cuda functions that need a CUDA device (torch.cuda.manual_seed and the like do not).
CUDA_CALLS = {"torch.cuda.set_device", "torch.cuda.synchronize", "torch.cuda.current_device",
              "torch.cuda.get_device_name", "torch.cuda.get_device_properties"}
_LETTER = re.compile(r"[A-Za-z]")


@implements("cuda-device")
def hard_coded_cuda(rules, call: ast.Call, where: Where, name: str | None, qualified: str | None) -> None:
    if where.device_unknown or where.catches(("RuntimeError", "AssertionError")):
        return
    what = None
    if name == "cuda" and isinstance(call.func, ast.Attribute) and qualified is None:
        what = ".cuda()"
    elif qualified in CUDA_CALLS or CUDA_TENSOR.match(qualified or ""):
        what = f"{qualified}()"
    elif qualified in ("torch.device", "torch.set_default_device") or (
            name == "to" and isinstance(call.func, ast.Attribute) and qualified is None):
        shown = qualified if qualified else ".to"
        what = cuda_argument(rules, call.args[0] if call.args else None, shown, where)
    if what is None and takes_a_device(call, name, qualified):
        for keyword in call.keywords:
            if keyword.arg == "device":
                what = cuda_argument(rules, keyword.value, "device=", where)
    if what is not None:
        rules.add(where, call, "cuda-device", "cuda", "method" if what == ".cuda()" else "other", what=what)


# ---------------------------------------------------------------- checkpoints


@implements("load-map-location")
def load(rules, call: ast.Call, where: Where, name: str | None, qualified: str | None) -> None:
    if qualified != "torch.load" or where.device_unknown or where.catches(("RuntimeError",)):
        return
    location = argument(call, 1, "map_location")
    if location is not None:
        text = cuda_text(rules, location, where)
        if text is not None:
            rules.add(where, call, "load-map-location", "named", text=text)
        return
    if any(keyword.arg is None for keyword in call.keywords) or loads_own_file(rules, call, where):
        return
    rules.add(where, call, "load-map-location", "missing")


def loads_own_file(rules, call: ast.Call, where: Where) -> bool:
    """Whether torch.load reads a file the script writes itself with torch.save (the same path
    expression, or the same file name in it): saved here, it loads here."""
    path = argument(call, 0, "f")
    if path is None:
        return False
    loaded = _path_forms(path, where.scope.lookup)
    for facts in rules.project.facts:
        for saved in facts.saved_paths:
            if loaded & _path_forms(saved, facts.binding):
                return True
    return False


def _path_forms(path: ast.expr, lookup) -> set[str]:
    """What identifies the file a path expression names: its text, the text of what a name
    stands for (`with open(p) as f`: p), and the file names written in it."""
    forms = {ast.dump(path)}
    if isinstance(path, ast.Name):
        bound, _ = lookup(path.id)
        if isinstance(bound, ast.Call) and getattr(bound.func, "id", None) == "open" and bound.args:
            bound = bound.args[0]
        if isinstance(bound, ast.expr):
            path = bound
            forms.add(ast.dump(path))
    forms.update(node.value for node in ast.walk(path)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str) and file_name(node.value))
    return forms


def file_name(text: str) -> bool:
    """"ckpt.pt", "saved/%s_%d.pth": enough of a name to tell one file from another (not ".pt")."""
    if text.startswith(".") and "/" not in text:
        return False
    return len(text.strip("./")) >= 4 and _LETTER.search(text) is not None


# ---------------------------------------------------------------- several processes


@implements("nccl-cpu")
def nccl(rules, call: ast.Call, where: Where, name: str | None, qualified: str | None) -> None:
    if not (qualified or "").startswith("torch.distributed") or where.device_unknown:
        return
    backend = argument(call, 0, "backend")
    known = where.literal(backend)
    if (known[0] if known is not None else where.value(backend)) != "nccl":
        return
    error = ("Distributed package doesn't have NCCL built in" if rules.target.system == "Darwin"
             else "ProcessGroupNCCL is only supported with GPUs, no GPUs found!")
    rules.add(where, call, "nccl-cpu", "nccl", "accelerate" if rules.uses_accelerate else "plain",
              error=error)
