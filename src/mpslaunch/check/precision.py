"""The precision rules: cuda's mixed precision on a plan without CUDA, and float64 on mps."""

from __future__ import annotations

import ast

from mpslaunch.check.calls import argument, called_name, keyword_value, method_chain
from mpslaunch.check.devices import AUTOCAST, CUDA_AUTOCAST, CUDA_SCALER, SCALER, moves_to_device
from mpslaunch.check.registry import implements
from mpslaunch.check.scan import FileFacts, Where

FLOAT64 = {"torch.float64", "torch.double"}


@implements("cuda-amp")
def cuda_amp(rules, call: ast.Call, where: Where, name: str | None, qualified: str | None) -> None:
    if qualified is None or where.device_unknown:
        return
    enabled = keyword_value(call, "enabled")
    if enabled is not None and where.value(enabled) is not True:
        return  # off on this plan, or only sometimes
    if qualified in CUDA_AUTOCAST or (
        qualified in AUTOCAST and _literal_is(call, 0, "device_type", where, "cuda")
    ):
        spelled = "torch.cuda.amp.autocast" if qualified in CUDA_AUTOCAST else 'autocast("cuda")'
        rules.add(
            where,
            call,
            "cuda-amp",
            "autocast",
            "autocast-accelerate" if rules.uses_accelerate else "autocast",
            spelled=spelled,
        )
    elif qualified in CUDA_SCALER or (
        qualified in SCALER
        and (
            not call.args
            and keyword_value(call, "device") is None
            or _literal_is(call, 0, "device", where, "cuda")
        )
    ):
        spelled = "torch.cuda.amp.GradScaler" if qualified in CUDA_SCALER else "GradScaler for cuda"
        rules.add(where, call, "cuda-amp", "scaler", spelled=spelled)


def _literal_is(call: ast.Call, position: int, keyword: str, where: Where, wanted: str) -> bool:
    known = where.literal(argument(call, position, keyword))
    return known is not None and known[0] == wanted


@implements("float64-mps")
def float64(rules, call: ast.Call, where: Where, name: str | None, qualified: str | None) -> None:
    if where.device_unknown:
        return
    facts = where.facts
    if (
        qualified == "torch.set_default_dtype"
        and call.args
        and facts.qualified(call.args[0]) in FLOAT64
        or qualified == "torch.set_default_tensor_type"
        and call.args
        and "DoubleTensor"
        in (facts.qualified(call.args[0]) or str(getattr(call.args[0], "value", "")))
    ):
        rules.add(where, call, "float64-mps", "default")
        return
    if name not in ("double", "to", "type") and not any(k.arg == "dtype" for k in call.keywords):
        return
    chain = method_chain(call)
    if any(_makes_float64(link, facts) for link in chain) and any(
        moves_to_device(link, where) for link in chain
    ):
        rules.add(where, call, "float64-mps", "tensor")


def _makes_float64(call: ast.Call, facts: FileFacts) -> bool:
    if called_name(call) == "double" and not call.args and facts.qualified(call.func) is None:
        return True
    dtypes = [keyword_value(call, "dtype")]
    if called_name(call) in ("to", "type"):
        dtypes += call.args[:2]
    return any(facts.qualified(node) in FLOAT64 for node in dtypes if node is not None)
