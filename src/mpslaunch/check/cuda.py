"""The rules about cuda written into a script: work put on cuda, checkpoints loaded onto it,
and nccl process groups on a plan without NVIDIA GPUs.

A rule speaks only when it is sure: about literals (and names bound once to one), about what
values.py can tell of an expression on the plan, never in a branch a device test rules out or
under one whose answer is unknown (walk.py), and never inside a try that catches the error.
"""

from __future__ import annotations

import ast

from mpslaunch.check.calls import argument
from mpslaunch.check.devices import CUDA_TENSOR, cuda_argument, cuda_text, takes_a_device
from mpslaunch.check.registry import Check, implements
from mpslaunch.check.saves import path_forms, saved_forms
from mpslaunch.check.scan import Where

# torch.cuda functions that need a CUDA device (torch.cuda.manual_seed and the like do not).
CUDA_CALLS = {
    "torch.cuda.set_device",
    "torch.cuda.synchronize",
    "torch.cuda.current_device",
    "torch.cuda.get_device_name",
    "torch.cuda.get_device_properties",
}


@implements("cuda-device")
def hard_coded_cuda(
    rules, call: ast.Call, where: Where, name: str | None, qualified: str | None
) -> None:
    if where.device_unknown or where.catches(("RuntimeError", "AssertionError")):
        return
    what = None
    if name == "cuda" and isinstance(call.func, ast.Attribute) and qualified is None:
        what = ".cuda()"
    elif qualified in CUDA_CALLS or CUDA_TENSOR.match(qualified or ""):
        what = f"{qualified}()"
    elif qualified == "torch.set_default_tensor_type" and call.args:
        kind = where.facts.qualified(call.args[0]) or where.value(call.args[0])
        what = f'torch.set_default_tensor_type("{kind}")' if CUDA_TENSOR.match(str(kind)) else None
    elif qualified in ("torch.device", "torch.set_default_device") or (
        name == "to" and isinstance(call.func, ast.Attribute) and qualified is None
    ):
        shown = qualified if qualified else ".to"
        what = cuda_argument(rules, call.args[0] if call.args else None, shown, where)
    if what is None and takes_a_device(call, name, qualified):
        for keyword in call.keywords:
            if keyword.arg == "device":
                what = cuda_argument(rules, keyword.value, "device=", where)
    if what is not None:
        rules.add(
            where,
            call,
            "cuda-device",
            "cuda",
            "method" if what == ".cuda()" else "other",
            what=what,
        )


# ---------------------------------------------------------------- checkpoints


@implements("load-map-location")
class Load(Check):
    """torch.load without map_location, or with one on cuda; not of a file the project writes."""

    def __init__(self, rules, rule) -> None:
        super().__init__(rules, rule)
        self._saved: set[str] | None = None

    def call(self, call: ast.Call, where: Where, name: str | None, qualified: str | None) -> None:
        if qualified != "torch.load" or where.device_unknown or where.catches(("RuntimeError",)):
            return
        location = argument(call, 1, "map_location")
        if location is not None:
            text = cuda_text(self.rules, location, where)
            if text is not None:
                self.rules.add(where, call, "load-map-location", "named", text=text)
            return
        if any(keyword.arg is None for keyword in call.keywords) or self.loads_own_file(
            call, where
        ):
            return
        self.rules.add(where, call, "load-map-location", "missing")

    def loads_own_file(self, call: ast.Call, where: Where) -> bool:
        """Whether torch.load reads a file the project writes itself (saves.py): saved here, it
        loads here."""
        path = argument(call, 0, "f")
        if path is None:
            return False
        if self._saved is None:
            self._saved = saved_forms(self.rules.project)
        return bool(path_forms(path, where.scope.lookup) & self._saved)


# ---------------------------------------------------------------- several processes


@implements("nccl-cpu")
def nccl(rules, call: ast.Call, where: Where, name: str | None, qualified: str | None) -> None:
    if not (qualified or "").startswith("torch.distributed") or where.device_unknown:
        return
    backend = argument(call, 0, "backend")
    known = where.literal(backend)
    if (known[0] if known is not None else where.value(backend)) != "nccl":
        return
    error = (
        "Distributed package doesn't have NCCL built in"
        if rules.target.system == "Darwin"
        else "ProcessGroupNCCL is only supported with GPUs, no GPUs found!"
    )
    rules.add(
        where,
        call,
        "nccl-cpu",
        "nccl",
        "accelerate" if rules.uses_accelerate else "plain",
        error=error,
    )
