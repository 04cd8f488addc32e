"""Which lines of a file a rule can be about, found in the text before it is parsed.

A rule looks at calls that name cuda, torch.load, float64, DataLoader and the like, so only the
lines that spell one of these (or a name imported or bound to a literal under another name)
matter. `launch` parses a script's module-level code whole and, of its functions and classes,
only those that contain such a line: the others become blank lines, which cost the parser
nothing and keep every line number. A script without a main guard is read whole (which of its
functions run when a worker imports it again needs them all).
"""

from __future__ import annotations

import bisect
import re
from collections import namedtuple
from functools import lru_cache

from mpslaunch.check import registry

# Besides what the rules look for (registry.py): the options whose defaults values.py reads.
ALWAYS = ("add_argument",)
_IMPORT_LINE = re.compile(r"(?m)^[ \t]*(?:from[ \t]+\S+[ \t]+)?import[ \t][^\n]*")
_RENAMED = re.compile(r"\bas[ \t]+(\w+)")
_MODULE_LITERAL = re.compile(r"""(?m)^([A-Za-z_]\w*)[ \t]*=[ \t]*(?:[rbuRBU]?["']|-?\d)""")
_MAIN_GUARD = re.compile(r"""(?m)^if[ \t(]+__name__[ \t]*==|^if[ \t(]+["']__main__["'][ \t]*==""")
# A line at column 0 that starts a new top-level statement (not a comment, a closing bracket or
# the next clause of a compound statement).
_TOP_LEVEL = re.compile(r"(?m)^(?![ \t]|#|\n|[)\]}]|else\b|elif\b|except\b|finally\b)")
_DEFINITION = re.compile(r"(?:async[ \t]+)?def[ \t]|class[ \t]|@")
_LETTER = re.compile(r"[A-Za-z]")
_DEFINED = re.compile(r"(?m)^(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)")


def folded(text: str) -> str:
    """The text with identifiers as Python reads them: NFKC, so `x.ｃｕｄａ()` spells cuda. Every
    line keeps its number (strings are folded too: only the syntax tree says what they hold)."""
    if text.isascii():
        return text
    import unicodedata

    words = unicodedata.normalize("NFKC", text)
    if words.count("\n") == text.count("\n"):
        return words
    return "\n".join(unicodedata.normalize("NFKC", line) for line in text.split("\n"))


def triggers() -> tuple[str, ...]:
    """What a rule can be about, as the source spells it."""
    return tuple(sorted({*ALWAYS, *(word for rule in registry.RULES for word in rule.words)}))


_VARIABLES = re.compile(
    r"environ|getenv|putenv|unsetenv"
)  # what reads or sets an environment variable


class Lines(namedtuple("Lines", "wanted variables")):
    """The sorted numbers of the lines that matter: those a rule can be about (`wanted`), and
    those that read or set an environment variable (`variables`)."""

    __slots__ = ()


@lru_cache(maxsize=1)
def sets_a_variable() -> tuple[re.Pattern, re.Pattern]:
    """What a line that sets an environment variable looks like (environment.py): one that sets
    a named one, and one that may set any of them. Compiled only for a text that names environ."""
    return (
        re.compile(
            r"""environ\[\s*["'](\w+)["']\s*\]\s*(?:=(?!=)|[-+]=)"""
            r"""|environ\.(?:setdefault|pop)\(\s*["'](\w+)["']|\bdel\s+[\w.]*environ\[\s*["'](\w+)["']"""
        ),
        re.compile(
            r"""environ\.(?:update|clear|popitem)\(|\b(?:putenv|unsetenv)\(|\benviron\s*=(?!=)"""
            r"""|environ\[(?!\s*["'])[^\]\n]*\]\s*=(?!=)"""
        ),
    )


@lru_cache(maxsize=4)
def _pattern(words: tuple[str, ...], names: tuple[str, ...]) -> re.Pattern:
    pattern = "|".join(map(re.escape, words))
    if names:
        pattern += r"|\b(?:" + "|".join(map(re.escape, names)) + r")\b"
    return re.compile(pattern)


def lines_of(text: str) -> Lines:
    """The lines that matter in the text `folded` gives."""
    words = triggers()
    names = set()
    for line in _IMPORT_LINE.findall(text):  # `import ... as DL`: DL stands for a trigger
        if any(word in line for word in words):
            names.update(_RENAMED.findall(line))
    names.update(_MODULE_LITERAL.findall(text))  # `device = "cuda"`, then `.to(device)`
    newlines = _newlines(text)
    wanted = {
        bisect.bisect_left(newlines, match.start()) + 1
        for match in _pattern(words, tuple(sorted(names))).finditer(text)
    }
    # an import inside a function: the module it reads is checked too
    wanted.update(
        bisect.bisect_left(newlines, match.start()) + 1
        for match in _IMPORT_LINE.finditer(text)
        if match.group().startswith((" ", "\t"))
    )
    variables = []
    if "environ" in text or "getenv" in text or "putenv" in text:
        variables = sorted(
            {bisect.bisect_left(newlines, match.start()) + 1 for match in _VARIABLES.finditer(text)}
        )
        texts = text.split(
            "\n"
        )  # a variable set: whether the plan still decides it depends on where
        sets_one, sets_any = sets_a_variable()
        wanted.update(
            line
            for line in variables
            if sets_one.search(texts[line - 1]) or sets_any.search(texts[line - 1])
        )
    return Lines(sorted(wanted), variables)


def wanted_lines(text: str) -> list[int]:
    """The sorted numbers of the lines a rule can be about (in the text `folded` gives)."""
    return lines_of(text).wanted


def import_lines(text: str) -> list[int]:
    """The sorted numbers of the lines that start an import statement."""
    return line_numbers(text, _IMPORT_LINE)


def line_numbers(text: str, pattern: re.Pattern) -> list[int]:
    """The sorted numbers of the lines where pattern matches."""
    newlines = _newlines(text)
    return sorted(
        {bisect.bisect_left(newlines, match.start()) + 1 for match in pattern.finditer(text)}
    )


def module_literal_names(text: str) -> frozenset[str]:
    """Names a module-level line binds to a literal (`device = "cuda"`, `NUM_WORKERS = 4`)."""
    return frozenset(_MODULE_LITERAL.findall(text))


def file_name(text: str) -> bool:
    """ "ckpt.pt", "saved/%s_%d.pth": enough of a name to tell one file from another (not ".pt")."""
    if text.startswith(".") and "/" not in text:
        return False
    return len(text.strip("./")) >= 4 and _LETTER.search(text) is not None


def has_main_guard_text(text: str) -> bool:
    return _MAIN_GUARD.search(text) is not None


def selected_source(text: str, words: str, wanted: list[int]) -> tuple[str, list[str]]:
    """The text with every top-level function or class that contains no wanted line blanked
    out, line numbers kept, and the names they define (as `words`, the folded text, spells
    them). A wrong split (a column-0 line inside a string) leaves text that does not parse, and
    the caller then parses the whole file."""
    newlines = _newlines(words)
    starts, decorated = [], False
    for match in _TOP_LEVEL.finditer(words):
        line = bisect.bisect_left(newlines, match.start()) + 1
        definition = _DEFINITION.match(words, match.start()) is not None
        if not decorated:  # a decorator's def belongs to it
            starts.append((line, definition))
        decorated = words.startswith("@", match.start())
    lines, spelled = text.split("\n"), words.split("\n")
    ends = [start for start, _ in starts[1:]] + [len(lines) + 1]
    blanked: list[str] = []
    for (first, definition), end in zip(starts, ends, strict=True):
        index = bisect.bisect_left(wanted, first)
        if definition and not (index < len(wanted) and wanted[index] < end):
            blanked += _DEFINED.findall("\n".join(spelled[first - 1 : end - 1]))
            lines[first - 1 : end - 1] = [""] * (end - first)
    return "\n".join(lines), blanked


@lru_cache(maxsize=4)
def _newlines(text: str) -> list[int]:
    return [match.start() for match in re.finditer("\n", text)]
