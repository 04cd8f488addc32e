"""How a call is written: the name it ends with, its keywords, the calls its receiver is made of."""

from __future__ import annotations

import ast


def called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def keyword_value(call: ast.Call, name: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


def argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    """The argument given at `position` or as `keyword`."""
    return call.args[position] if len(call.args) > position else keyword_value(call, keyword)


def method_chain(call: ast.Call) -> list[ast.Call]:
    """`x.to(d).double()` -> both calls: the call and the calls its receiver is made of."""
    chain = [call]
    node = call.func
    while isinstance(node, ast.Attribute):
        node = node.value
        if isinstance(node, ast.Call):
            chain.append(node)
            node = node.func
    return chain
