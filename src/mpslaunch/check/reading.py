"""Reading a script and the modules it imports from its own folder, as syntax trees.

Nothing is imported or run: each file is read as bytes, decoded (UTF-8 unless its coding line
says otherwise), and parsed with `ast`. The script's own problems (missing, unreadable, not
text, a syntax error, too big) are ScriptErrors; a module it imports with such a problem is
only skipped, since Python would stop at it with its own message.
"""

from __future__ import annotations

import ast
import bisect
import io
import os
import tokenize
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from mpslaunch.check.selection import (has_main_guard_text, import_lines, selected_source,
                                      wanted_lines)
from mpslaunch.output import MpslaunchError

# A training script is a few thousand lines; past this, parsing alone would cost seconds.
MAX_FILE_BYTES = 2_000_000
MAX_FILES = 60  # the script and the local modules it imports, in import order


class ScriptError(MpslaunchError):
    """The script cannot be checked: bad input, exit code 2."""


@dataclass(frozen=True, eq=False)
class SourceFile:
    path: Path
    shown: str  # the path as messages show it
    text: str
    tree: ast.Module  # without the functions and classes that cannot matter, when read in part
    is_script: bool  # run as __main__; an imported module's main block does not run
    wanted_lines: list[int]  # the lines a rule can be about (selection.py)
    left_out: tuple[str, ...] = ()  # names of the module-level definitions not parsed

    @cached_property
    def imports(self) -> tuple[ast.stmt, ...]:
        """Its import statements, wherever they are (found through the lines that spell them)."""
        lines = import_lines(self.text)
        return tuple(node for node in statements(self.tree.body, lines)
                     if isinstance(node, (ast.Import, ast.ImportFrom)))


@dataclass(frozen=True)
class Sources:
    files: tuple[SourceFile, ...]
    skipped: tuple[str, ...]  # one line per local module that could not be read


def read_sources(script: Path, whole: bool = True) -> Sources:
    """The script and the local modules it imports (transitively), parsed: whole, or (for
    launch, where speed counts and Python reports syntax errors itself) only in the parts a
    rule can be about."""
    first = _source(script, True, whole)
    files, skipped, seen = [first], [], {script.resolve()}
    folder = script.resolve().parent
    index = 0
    while index < len(files) and len(files) < MAX_FILES:
        for path in local_imports(files[index], folder):
            if path.resolve() in seen or len(files) >= MAX_FILES:
                continue
            seen.add(path.resolve())
            try:
                files.append(_source(path, False, whole))
            except ScriptError as error:
                skipped.append(str(error))
        index += 1
    return Sources(tuple(files), tuple(skipped))


def _source(path: Path, is_script: bool, whole: bool) -> SourceFile:
    text = _decode(path, _read_bytes(path))
    wanted = wanted_lines(text)
    if not whole and (has_main_guard_text(text) or not is_script):
        selected, left_out = selected_source(text, wanted)
        try:
            tree = ast.parse(selected, filename=str(path))
            return SourceFile(path, _shown(path), text, tree, is_script, wanted, tuple(left_out))
        except (SyntaxError, ValueError, RecursionError):
            pass  # a split inside a string: read it whole
    return SourceFile(path, _shown(path), text, parse(path, text), is_script, wanted)


def parse(path: Path, text: str) -> ast.Module:
    try:
        return ast.parse(text, filename=str(path))
    except SyntaxError as error:
        raise ScriptError(f"{_shown(path)}:{error.lineno or 1}: syntax error: {error.msg}; "
                          "fix it (python -m py_compile shows the same)") from None
    except (ValueError, RecursionError) as error:  # a null byte; absurdly deep nesting
        raise ScriptError(f"{_shown(path)} cannot be parsed as Python ({error}); "
                          "give the training script, a .py file") from None


def _read_bytes(path: Path) -> bytes:
    if path.is_dir():
        raise ScriptError(f"{_shown(path)} is a folder; give the training script, a .py file")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ScriptError(f"{_shown(path)} is {size / 1e6:.1f} MB, too big to check (a "
                              f"training script is far smaller; the check reads at most "
                              f"{MAX_FILE_BYTES // 1_000_000} MB); give the script itself")
        with open(path, "rb") as file:
            return file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ScriptError(f"no script at {_shown(path)} (looked in {Path.cwd()}); "
                          "check the path") from None
    except OSError as error:
        raise ScriptError(f"cannot read {_shown(path)} ({error.strerror}); check its "
                          "permissions") from None


def _decode(path: Path, data: bytes) -> str:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError) as error:  # an unknown coding line
        raise ScriptError(f"{_shown(path)}: {error}; Python cannot read it either") from None
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ScriptError(f"{_shown(path)}:{line}: not {error.encoding} text (byte "
                          f"0x{data[error.start]:02x}); save it as UTF-8, or give the Python "
                          "script, not a binary file") from None


def local_imports(source: SourceFile, folder: Path) -> list[Path]:
    """Files of the modules `source` imports that live in the script's folder (sys.path[0]
    when it runs), or relative to the module's own package."""
    found = []
    for node in source.imports:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += _module_files(folder, alias.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = source.path.resolve().parent
                for _ in range(node.level - 1):
                    base = base.parent
            else:
                base = folder
            parts = node.module.split(".") if node.module else []
            found += _module_files(base, parts)
            for alias in node.names:  # `from package import module`
                found += _module_files(base, [*parts, alias.name])
    return found


def _module_files(base: Path, parts: list[str]) -> list[Path]:
    """The files `import a.b.c` runs from under base: each package's __init__.py, then the
    module; none when the first part is not there (the module is installed, not local)."""
    files, here = [], base
    for part in parts:
        package, module = here / part / "__init__.py", here / f"{part}.py"
        if package.is_file():  # Python looks for a package before a module of the same name
            files.append(package)
        elif module.is_file():
            files.append(module)
            break
        elif not (here / part).is_dir():
            break
        here = here / part
    return files


def statements(body: list[ast.stmt], lines: list[int]):
    """The statements in a body, nested ones included, that span one of these (sorted) lines."""
    for node in body:
        index = bisect.bisect_left(lines, node.lineno)
        if index == len(lines) or lines[index] > (node.end_lineno or node.lineno):
            continue
        yield node
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, name, None)
            if inner:
                yield from statements(inner, lines)


def _shown(path: Path) -> str:
    """The path relative to the current folder when it is below it, else as given."""
    try:
        if path.resolve().is_relative_to(Path.cwd().resolve()):
            return os.path.relpath(path)
    except (OSError, ValueError):  # a vanished folder; another drive on Windows
        pass
    return str(path)
