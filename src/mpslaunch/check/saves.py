"""Files the project writes itself with torch.save: saved where the script runs, they load there,
so a torch.load of one needs no map_location.

What counts as written: the path of each torch.save in the files read; through a function that
hands one of its parameters to torch.save (`def save_checkpoint(state, filename="ckpt.pth"):
torch.save(state, filename)`, or `torch.save(*args, **kwargs)`), what its calls give for that
parameter, and its default; the torch.save paths of the scripts beside the script that name a
file it loads (a data-preparation script: reading.py finds them). A path is known by its text,
what a name stands for, and the file names written in it.
"""

from __future__ import annotations

import ast
import re

from mpslaunch.check.calls import called_name
from mpslaunch.check.reading import statements
from mpslaunch.check.scan import FUNCTION_NODES, FileFacts, Project
from mpslaunch.check.selection import file_name

_SAVE = re.compile(r"\bsave\(")


def saved_forms(project: Project) -> set[str]:
    """What identifies each file the project writes (path_forms of every path saved to)."""
    forms: set[str] = set()
    for facts in (*project.facts, *project.writers):
        for path, wrapper in _saves(facts):
            if wrapper is None:
                forms |= path_forms(path, facts.binding)
            else:
                forms |= _wrapper_forms(project, *wrapper)
    return forms


def _saves(facts: FileFacts):
    """(path, None) for each torch.save with its path written out; (None, wrapper) where the
    path is a parameter of the function around it: wrapper = (function, position, parameter)."""
    for node in facts.nodes_on(_SAVE):
        if not isinstance(node, ast.Call) or facts.qualified(node.func) != "torch.save":
            continue
        path = (
            node.args[1]
            if len(node.args) > 1
            else next((k.value for k in node.keywords if k.arg == "f"), None)
        )
        function = next(
            (
                s
                for s in reversed(list(statements(facts.source.tree.body, [node.lineno])))
                if isinstance(s, FUNCTION_NODES)
            ),
            None,
        )
        if (
            isinstance(path, ast.Starred)
            or path is None
            and any(isinstance(a, ast.Starred) for a in node.args)
        ):
            if function is not None and function.args.vararg is not None:
                yield None, (function, 1, None)  # torch.save(*args, **kwargs): the caller's second
            continue
        parameters = (
            [a.arg for a in (*function.args.posonlyargs, *function.args.args)] if function else []
        )
        if isinstance(path, ast.Name) and path.id in parameters:
            yield None, (function, parameters.index(path.id), path.id)
        elif path is not None:
            yield path, None


def _wrapper_forms(
    project: Project,
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    position: int,
    parameter: str | None,
) -> set[str]:
    """The forms of what calls of a save wrapper give for its path parameter, and its default."""
    forms: set[str] = set()
    positional = [*function.args.posonlyargs, *function.args.args]
    if parameter is not None:
        defaults = function.args.defaults
        index = position - (len(positional) - len(defaults))
        if 0 <= index < len(defaults):
            forms |= path_forms(defaults[index], lambda name: (None, None))
    offset = 1 if positional and positional[0].arg in ("self", "cls") else 0
    pattern = re.compile(rf"\b{re.escape(function.name)}\(")
    for facts in (*project.facts, *project.writers):
        for call in facts.nodes_on(pattern):
            if not isinstance(call, ast.Call) or called_name(call) != function.name:
                continue
            given = next((k.value for k in call.keywords if parameter and k.arg == parameter), None)
            if (
                given is None
                and len(call.args) > position - offset >= 0
                and not any(isinstance(a, ast.Starred) for a in call.args[: position - offset + 1])
            ):
                given = call.args[position - offset]
            if given is not None:
                forms |= path_forms(given, facts.binding)
    return forms


def path_forms(path: ast.expr, lookup) -> set[str]:
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
    forms.update(
        node.value
        for node in ast.walk(path)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and file_name(node.value)
    )
    return forms
