"""Reading a script and the modules it imports from its own folder, as syntax trees.

Nothing is imported or run: each file is opened only when regular (settings/paths.py),
read as bytes, decoded (UTF-8 unless its coding line says otherwise), and parsed with `ast`; a
notebook's code cells are read as one script (notebook.py). The script's own problems (missing,
unreadable, not text, a syntax error, too big) are ScriptErrors; a module it imports with such a
problem is only skipped, since Python would stop at it with its own message. Past MAX_FILES, the
modules still imported are named as not read. What was read (each file's digest) and which
module files were looked for and missing are kept with the sources, for the kept findings.
"""

from __future__ import annotations

import ast
import bisect
import io
import os
import re
import tokenize
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from mpslaunch.check.fingerprint import digest as digest_of
from mpslaunch.check.fingerprint import listing
from mpslaunch.check.selection import (
    Lines,
    file_name,
    folded,
    has_main_guard_text,
    import_lines,
    lines_of,
    selected_source,
)
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import current_folder, open_regular, unreadable

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from mpslaunch.check.notebook import NotebookCode

# A training script is a few thousand lines; past this, parsing alone would cost seconds.
MAX_FILE_BYTES = 2_000_000
MAX_NOTEBOOK_BYTES = 50_000_000  # mostly the outputs (images) kept in it, which are not parsed
MAX_FILES = 60  # the script and the local modules it imports, in import order
TOO_DEEP = "it nests expressions too deeply for the check to read; check it by hand"
MAX_BESIDE = 40  # the scripts beside the script looked at for one that writes a file it loads
_LOAD_LINE = re.compile(r"load\(([^\n]*)")  # what follows load( on its line
_QUOTED = re.compile(r"""["']([^"'\n]+)["']""")


class ScriptError(MpslaunchError):
    """The script cannot be checked: bad input, exit code 2."""


class Unchecked(ScriptError):
    """A script Python may run but the check cannot read: `launch` says so, then runs it."""

    def __init__(self, shown: str, reason: str):
        super().__init__(f"{shown} cannot be checked: {reason}")
        self.shown, self.reason = shown, reason


@dataclass(frozen=True, eq=False)
class SourceFile:
    path: Path
    shown: str  # the path as messages show it
    text: str
    tree: ast.Module  # without the functions and classes that cannot matter, when read in part
    is_script: bool  # run as __main__; an imported module's main block does not run
    lines: Lines  # the lines a rule can be about, that may stop a block, ... (selection.py)
    left_out: tuple[str, ...] = ()  # names of the module-level definitions not parsed
    digest: str = ""  # of the bytes read
    cells: NotebookCode | None = None  # a notebook's: which cell each line of `text` is from

    @property
    def wanted_lines(self) -> list[int]:
        return self.lines.wanted

    @cached_property
    def words(self) -> str:
        """The text with identifiers as Python reads them (selection.folded): what the
        searches of the text see."""
        return folded(self.text)

    @cached_property
    def imports(self) -> tuple[ast.stmt, ...]:
        """Its import statements, wherever they are (found through the lines that spell them)."""
        lines = import_lines(self.words)
        return tuple(
            node
            for node in statements(self.tree.body, lines)
            if isinstance(node, (ast.Import, ast.ImportFrom))
        )


@dataclass(frozen=True)
class Sources:
    files: tuple[SourceFile, ...]
    skipped: tuple[str, ...]  # one line per local module, or notebook cell, that was not read
    absent: tuple[str, ...] = ()  # module files looked for and missing (a folder ends with /)
    writers: tuple[SourceFile, ...] = ()  # scripts beside it that save a file it loads
    beside: tuple[tuple[str, str], ...] = ()  # (path, digest) of the others looked at for that
    listed: tuple[str, str] | None = None  # (folder, fingerprint.listing) when they were looked at

    @property
    def read(self) -> list[tuple[str, str]]:
        """(real path, digest) of each file read."""
        return [
            *(
                (os.path.realpath(source.path), source.digest)
                for source in (*self.files, *self.writers)
            ),
            *self.beside,
        ]


def read_sources(script: Path, whole: bool = True) -> Sources:
    """The script and the local modules it imports (transitively), parsed: whole, or (for
    launch, where speed counts and Python reports syntax errors itself) only in the parts a
    rule can be about."""
    first = _source(script, True, whole)
    files, seen, absent = [first], {_real(script)}, set[str]()
    skipped = list(first.cells.left_out) if first.cells else []
    folder = Path(_real(script)).parent
    index = 0
    while index < len(files):
        for path in local_imports(files[index], folder, absent):
            if _real(path) in seen:
                continue
            seen.add(_real(path))
            if len(files) >= MAX_FILES:
                skipped.append(
                    f"{_shown(path)}: not read (the check reads the script and at most "
                    f"{MAX_FILES - 1} of the local modules it imports)"
                )
                continue
            try:
                files.append(_source(path, False, whole))
            except ScriptError as error:
                skipped.append(str(error))
        index += 1
    loaded = {
        name
        for source in files
        for rest in _LOAD_LINE.findall(source.words)
        for name in _QUOTED.findall(rest)
        if file_name(name)
    }
    if not loaded:
        return Sources(tuple(files), tuple(skipped), tuple(sorted(absent)))
    writers, beside = _writers(folder, seen, loaded)
    return Sources(
        tuple(files),
        tuple(skipped),
        tuple(sorted(absent)),
        writers,
        beside,
        (str(folder), listing(str(folder))),
    )


def _writers(
    folder: Path, seen: set[str], loaded: set[str]
) -> tuple[tuple[SourceFile, ...], tuple]:
    """The scripts beside the script (not read as its modules) that torch.save one of the file
    names it loads, parsed, and (path, digest) of the others looked at."""
    try:
        names = sorted(name for name in os.listdir(folder) if name.endswith(".py"))[:MAX_BESIDE]
    except OSError:
        return (), ()
    writers, beside = [], []
    for name in names:
        path = folder / name
        if _real(path) in seen:
            continue
        try:
            data = _read_bytes(path, MAX_FILE_BYTES)
            if b"save(" in data and any(
                f"{quote}{file}{quote}".encode() in data for file in loaded for quote in "\"'"
            ):
                text = _decode(path, data)
                writers.append(
                    SourceFile(
                        path,
                        _shown(path),
                        text,
                        parse(path, text),
                        True,
                        lines_of(folded(text)),
                        digest=digest_of(data),
                    )
                )
            else:
                beside.append((_real(path), digest_of(data)))
        except ScriptError:
            continue  # not one Python can run either
    return tuple(writers), tuple(beside)


def _real(path: Path) -> str:
    return os.path.realpath(path)  # never raises, even on a symlink loop


def _source(path: Path, is_script: bool, whole: bool) -> SourceFile:
    notebook = is_script and path.suffix == ".ipynb"
    data = _read_bytes(path, MAX_NOTEBOOK_BYTES if notebook else MAX_FILE_BYTES)
    digest = digest_of(data)  # what the kept findings are checked against
    if notebook:
        from mpslaunch.check.notebook import notebook_code  # only for a notebook

        cells = notebook_code(_shown(path), data, ScriptError)
        return SourceFile(
            path,
            _shown(path),
            cells.text,
            parse(path, cells.text),
            is_script,
            lines_of(folded(cells.text)),
            digest=digest,
            cells=cells,
        )
    if is_script:
        _refuse_what_is_not_source(path, data)
    text = _decode(path, data)
    words = folded(text)
    lines = lines_of(words)
    if not whole and (has_main_guard_text(words) or not is_script):
        selected, left_out = selected_source(text, words, lines.wanted)
        try:
            tree = ast.parse(selected, filename=str(path))
            return SourceFile(
                path, _shown(path), text, tree, is_script, lines, tuple(left_out), digest
            )
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            pass  # a split inside a string: read it whole
    return SourceFile(path, _shown(path), text, parse(path, text), is_script, lines, digest=digest)


def parse(path: Path, text: str) -> ast.Module:
    try:
        return ast.parse(text, filename=str(path))
    except SyntaxError as error:
        raise ScriptError(
            f"{_shown(path)}:{error.lineno or 1}: syntax error: {error.msg}; "
            "fix it (python -m py_compile shows the same)"
        ) from None
    except (RecursionError, MemoryError):  # Python's parser gives up on such nesting too
        raise Unchecked(
            _shown(path),
            "it nests expressions too deeply for Python's parser; split the expression",
        ) from None
    except ValueError as error:  # a null byte
        raise ScriptError(
            f"{_shown(path)} cannot be parsed as Python ({error}); "
            "give the training script, a .py file"
        ) from None


def _read_bytes(path: Path, most: int) -> bytes:
    """The file's bytes, at most `most`; never opens what is not a regular file."""
    try:
        with open(open_regular(path), "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size > most:
                raise Unchecked(
                    _shown(path),
                    f"it is {size / 1e6:.1f} MB, too big to check (the "
                    f"check reads at most {most // 1_000_000} MB; a training script is "
                    "far smaller)",
                )
            return file.read(most + 1)
    except OSError as error:
        raise ScriptError(unreadable(_shown(path), error)) from None


def _refuse_what_is_not_source(path: Path, data: bytes) -> None:
    """Files python runs that hold no source to read: bytecode, and a zip archive (python runs
    the __main__.py in it)."""
    import importlib.util

    if path.suffix == ".pyc" or data.startswith(importlib.util.MAGIC_NUMBER):
        raise ScriptError(
            f"{_shown(path)} is compiled Python (bytecode): python runs it, but the "
            "check reads source; check the .py file it was compiled from"
        )
    if b"PK\x05\x06" in data[-65_600:]:  # a zip's last record, within its comment's reach
        import zipfile

        if zipfile.is_zipfile(io.BytesIO(data)):
            raise ScriptError(
                f"{_shown(path)} is a zip archive: python runs the __main__.py in "
                "it, but the check reads source files; check that __main__.py"
            )


def _decode(path: Path, data: bytes) -> str:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError) as error:  # an unknown coding line
        raise ScriptError(f"{_shown(path)}: {error}; Python cannot read it either") from None
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ScriptError(
            f"{_shown(path)}:{line}: not {error.encoding} text (byte "
            f"0x{data[error.start]:02x}); save it as UTF-8, or give the Python "
            "script, not a binary file"
        ) from None


def local_imports(source: SourceFile, folder: Path, absent: set[str]) -> list[Path]:
    """Files of the modules `source` imports that live in the script's folder (sys.path[0]
    when it runs), or relative to the module's own package; `absent` gains the files and
    folders looked for that are not there."""
    found = []
    for node in source.imports:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += _module_files(folder, alias.name.split("."), absent)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = Path(_real(source.path)).parent
                for _ in range(node.level - 1):
                    base = base.parent
            else:
                base = folder
            parts = node.module.split(".") if node.module else []
            found += _module_files(base, parts, absent)
            for alias in node.names:  # `from package import module`
                found += _module_files(base, [*parts, alias.name], absent)
    return found


def _module_files(base: Path, parts: list[str], absent: set[str]) -> list[Path]:
    """The files `import a.b.c` runs from under base: each package's __init__.py, then the
    module; none when the first part is not there (the module is installed, not local)."""
    files, here = [], base
    for part in parts:
        package, module, folder = here / part / "__init__.py", here / f"{part}.py", here / part
        if os.path.isfile(package):  # Python looks for a package before a module of the same name
            files.append(package)
            here = folder
            continue
        absent.add(str(package))
        if os.path.isfile(module):
            files.append(module)
            break
        absent.add(str(module))
        if not os.path.isdir(folder):
            absent.add(str(folder) + os.sep)
            break
        here = folder
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
    here = current_folder()
    if here and Path(_real(path)).is_relative_to(_real(Path(here))):
        return os.path.relpath(path)
    return str(path)
