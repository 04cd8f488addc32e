"""The target must exist before anything starts: a script (or what else python runs: a folder
with a __main__.py, bytecode, a zip archive), a module (-m), or an executable (--no_python),
each refused in one line that says what to check and why.

A script must be a regular file, opened as the check opens it (settings/paths.py), so that a
FIFO named like a script is refused at once instead of hanging the launch.
"""

from __future__ import annotations

import os
import sys

from mpslaunch.output import MpslaunchError
from mpslaunch.settings import LaunchRequest, current_folder, folder_main, open_regular, unreadable


def check_target(request: LaunchRequest) -> None:
    if request.module:
        _check_module(request.target)
    elif request.no_python:
        _check_executable(request.target)
    else:
        _check_script(request.target)


def _check_executable(name: str) -> None:
    import shutil  # only with --no_python

    if shutil.which(name) is None:
        raise MpslaunchError(
            f"{name} is not an executable file (--no_python runs it directly, "
            "looking on PATH when the name has no '/'); check the path and its "
            "permissions, or drop --no_python"
        )


def _check_script(target: str) -> None:
    """A file python runs (source, bytecode, a zip archive), or a folder with a __main__.py."""
    source = folder_main(target) or target
    try:
        os.close(open_regular(source))
    except OSError as error:
        raise MpslaunchError(unreadable(_shown(source), error, launching=True)) from None
    if target.endswith(".ipynb"):  # Python reads the notebook's JSON as an expression
        raise MpslaunchError(
            f"{_shown(target)} is a Jupyter notebook, which python cannot run; "
            f"export its code with `jupyter nbconvert --to script {target}` and "
            "launch the .py file it writes"
        )


def _shown(target: str) -> str:
    from pathlib import Path  # only on a refusal or a notebook

    return str(Path(target))


def _check_module(name: str) -> None:
    """Like `python -m`, look in the current folder first; never import the module's package."""
    here = current_folder()
    if not _module_exists(name, [*([here] if here else []), *sys.path[1:]]):
        raise MpslaunchError(
            f"no module named {name!r} can be found from "
            f"{here or 'here (the current folder was removed)'}; check the name, "
            "or install the package that provides it"
        )


def _module_exists(name: str, search_path: list[str]) -> bool:
    import importlib.machinery  # only with -m
    import importlib.util

    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return False
    spec = importlib.machinery.PathFinder.find_spec(parts[0], search_path)
    if spec is None:
        return importlib.util.find_spec(parts[0]) is not None  # built-in or frozen
    locations = list(spec.submodule_search_locations or [])
    for part in parts[1:]:
        if not locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, locations)
        if spec is None:
            return False
        locations = list(spec.submodule_search_locations or [])
    return True
