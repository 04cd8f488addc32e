"""A Jupyter notebook read as the script its code cells make, in order: what its kernel runs.

A cell is compiled on its own by the kernel, so each is parsed on its own: IPython's own lines
(`%magic`, `!shell`, `x = !ls`) become `pass`, which keeps every line number; a cell that is not
Python (`%%bash` and the other cell magics) or does not parse is left out and named. Findings
name the cell, counted from 1 over all the notebook's cells as they appear, and the line in it.
"""

from __future__ import annotations

import ast
import bisect
import json
import re
from dataclasses import dataclass

from mpslaunch.check.report import Finding
from mpslaunch.output import MpslaunchError

# Workers that a kernel starts by spawn do not run the notebook again, as they run a script.
NOT_IN_A_NOTEBOOK = ("workers-main-guard",)
# A line IPython rewrites before Python sees it.
_IPYTHON_LINE = re.compile(r"^([ \t]*)(?:[%!]|[\w.]+[ \t]*=[ \t]*[%!])")


@dataclass(frozen=True)
class NotebookCode:
    text: str  # the code cells read, one after another
    starts: tuple[int, ...]  # the line of `text` where each cell read starts
    numbers: tuple[int, ...]  # and that cell's number
    left_out: tuple[str, ...]  # one line per code cell not read, and why

    def where(self, line: int) -> tuple[int, int]:
        """The cell number and the line in that cell of a line of `text`."""
        index = max(bisect.bisect_right(self.starts, line) - 1, 0)
        return self.numbers[index], line - self.starts[index] + 1


def in_cells(findings: list[Finding], shown: str, code: NotebookCode) -> list[Finding]:
    """The findings, those in the notebook `shown` naming the cell and the line in it."""
    named = []
    for finding in findings:
        if finding.file != shown:
            named.append(finding)  # in a module the notebook imports
        elif finding.rule not in NOT_IN_A_NOTEBOOK:
            number, line = code.where(finding.line)
            named.append(finding._replace(file=f"{shown}:cell_{number}", line=line))
    return named


def notebook_code(shown: str, data: bytes, error: type[MpslaunchError]) -> NotebookCode:
    """The code cells of the notebook `shown`; `error` for a file that is not a Python notebook."""
    cells = _cells(shown, data, error)
    lines: list[str] = []
    starts, numbers, left_out = [], [], []
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        code, problem = _cell_code(cell.get("source", ""))
        if problem:
            left_out.append(f"{shown}:cell_{number}{problem}")
            continue
        starts.append(len(lines) + 1)
        numbers.append(number)
        lines += code.split("\n")
    return NotebookCode("\n".join(lines) + "\n", tuple(starts), tuple(numbers), tuple(left_out))


def _cells(shown: str, data: bytes, error: type[MpslaunchError]) -> list:
    try:
        notebook = json.loads(data)
    except ValueError as problem:  # not JSON, or not text
        raise error(
            f"{shown} is not a Jupyter notebook ({problem}); give the notebook as Jupyter "
            "saved it, or the training script"
        ) from None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        raise error(
            f"{shown} is not a Jupyter notebook of format 4 (it has no list of cells); "
            f"`jupyter nbconvert --to notebook --inplace {shown}` updates an older one"
        )
    metadata = notebook.get("metadata")
    language = _language(metadata if isinstance(metadata, dict) else {})
    if language.lower() not in ("", "python"):
        raise error(f"{shown} is a notebook in {language}; the check reads Python")
    return cells


def _language(metadata: dict) -> str:
    for section, field in (("kernelspec", "language"), ("language_info", "name")):
        value = metadata.get(section)
        name = value.get(field) if isinstance(value, dict) else None
        if isinstance(name, str):
            return name
    return ""


def _cell_code(source) -> tuple[str, str]:
    """The cell's code as Python parses it, or what is wrong with it (after the cell's name)."""
    if isinstance(source, list) and all(isinstance(part, str) for part in source):
        source = "".join(source)
    if not isinstance(source, str):
        return "", ": its source is not text"
    source = source.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n")
    if source.lstrip().startswith("%%"):
        return "", f": a {source.lstrip().split()[0]} cell, not Python"
    problem = _parse_problem(source)
    if problem is None:
        return source, ""
    code = "\n".join(_IPYTHON_LINE.sub(r"\1pass  # ", line, count=1) for line in source.split("\n"))
    problem = _parse_problem(code)
    return (code, "") if problem is None else ("", problem)


def _parse_problem(code: str) -> str | None:
    try:
        ast.parse(code)
    except SyntaxError as error:
        return f":{error.lineno or 1}: syntax error: {error.msg}"
    except (ValueError, RecursionError, MemoryError):
        return ": nests expressions too deeply to read, or holds a null byte"
    return None
