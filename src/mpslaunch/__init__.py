"""mpslaunch: launch PyTorch training on your own machine, Apple silicon first."""

from __future__ import annotations

__version__ = "0.1.0"

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on every launch
if TYPE_CHECKING:
    from typing import Any, ClassVar, TypeVar

    from typing_extensions import Self, dataclass_transform

    _Class = TypeVar("_Class")

    class Record(tuple[Any, ...]):
        """What type checkers know of a record besides its fields (dataclass_transform on
        `record` gives those): the namedtuple it is at run time."""

        _fields: ClassVar[tuple[str, ...]]
        _field_defaults: ClassVar[dict[str, Any]]

        def __new__(cls, *values: Any, **fields: Any) -> Self: ...
        def _replace(self, **changes: Any) -> Self: ...
        def _asdict(self) -> dict[str, Any]: ...
else:
    Record = object  # a record's base, for type checkers: `record` makes the namedtuple

    def dataclass_transform(**_):  # typing's marker for type checkers; nothing at run time
        return lambda function: function


def command_line() -> int:
    """The `mpslaunch` program (its console script and `python -m mpslaunch`). Ctrl-C before a
    run began, while the launcher's modules load or it makes its plan, ends in one line and 130;
    a run handles its own stops."""
    try:
        from mpslaunch.commands import main

        return main()
    except KeyboardInterrupt:
        import os

        try:  # stderr may be closed: the exit code still says it
            os.write(2, b"mpslaunch: stopped by SIGINT before anything ran (exit code 130)\n")
        except OSError:
            pass
        return 130


def lazy_names(package: str, modules: dict[str, tuple[str, ...]]):
    """A package's module `__getattr__` (PEP 562): each name in `modules` (module -> names) is
    imported from its module on first use, so importing the package costs nothing more."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        import importlib

        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    return __getattr__


@dataclass_transform(frozen_default=True)
def record(cls: type[_Class]) -> type[_Class]:
    """A class written as a frozen dataclass is (annotated fields, defaults, methods), made a
    namedtuple: defining a dataclass compiles several functions, which every launch would pay
    for, and `dataclasses` imports `inspect`. Written `@record class Name(Record):`, or with the
    record it subclasses as base, whose fields come first; fields with defaults come last. Its
    values: `_replace(...)`, `_fields`, `_field_defaults`, `_asdict()`, and the annotations (as
    written) in `__annotations__`."""
    from collections import namedtuple  # already imported by subprocess and re

    base: Any = next((base for base in cls.__bases__ if hasattr(base, "_fields")), None)
    own = tuple(cls.__dict__.get("__annotations__", {}))
    names = (*(base._fields if base else ()), *own)
    defaults = {
        **(base._field_defaults if base else {}),
        **{name: cls.__dict__[name] for name in own if name in cls.__dict__},
    }
    required = len(names) - len(defaults)
    if set(names[required:]) != set(defaults):
        raise TypeError(f"{cls.__name__}: a field without a default follows one with a default")
    tail = [defaults[name] for name in names[required:]]
    # a namedtuple of cls's fields, which type checkers read from cls itself
    fields = namedtuple(cls.__name__, names, defaults=tail, module=cls.__module__)  # type: ignore[misc]
    namespace = {
        key: value
        for key, value in cls.__dict__.items()
        if key not in own and key not in ("__dict__", "__weakref__")
    }
    namespace["__slots__"] = ()
    bases = (fields, *cls.__bases__) if base else (fields,)
    made = type(cls.__name__, bases, namespace)
    for value in namespace.values():  # zero-argument super() in a method means the class made
        function = getattr(value, "__func__", getattr(value, "fget", value))
        for cell in getattr(function, "__closure__", None) or ():
            if cell.cell_contents is cls:
                cell.cell_contents = made
    return made


# kind: the variable that moves it, then the folder under the home on Linux and on macOS
_USER_FOLDERS = {
    "config": ("XDG_CONFIG_HOME", ".config", "Library/Application Support"),
    "cache": ("XDG_CACHE_HOME", ".cache", "Library/Caches"),
}


def user_folder(kind: str) -> str:
    """The user's "config" or "cache" folder for mpslaunch: $MPSLAUNCH_CONFIG_DIR or
    $MPSLAUNCH_CACHE_DIR, else where platformdirs puts it. Worked out here where the answer is
    plain (importing platformdirs costs more than the rest of a launch's start); platformdirs
    answers the rest (tests/test_user_folders.py holds the two together)."""
    import os
    import sys

    override = os.environ.get(f"MPSLAUNCH_{kind.upper()}_DIR")
    if override:
        return os.path.expanduser(override)
    plain = plain_user_folder(kind, sys.platform, os.environ)
    if plain:
        return plain
    import platformdirs

    return getattr(platformdirs, f"user_{kind}_dir")("mpslaunch", appauthor=False)


def plain_user_folder(kind: str, platform: str, environ) -> str | None:
    """The folder on Linux and macOS with an absolute HOME, and an XDG variable that every
    platformdirs release since 4.0 reads alike: unset or empty, or on Linux an absolute path.
    None elsewhere."""
    import os

    variable, linux, mac = _USER_FOLDERS[kind]
    home, moved = environ.get("HOME", ""), environ.get(variable, "")
    if not home.startswith("/") or "ANDROID_DATA" in environ:
        return None
    if platform == "linux" and moved.startswith("/"):
        return os.path.join(moved, "mpslaunch")
    if platform not in ("linux", "darwin") or moved:
        return None
    return os.path.join(home.rstrip("/") or "/", linux if platform == "linux" else mac, "mpslaunch")


# mpslaunch.launch, imported on first use: `import mpslaunch` stays cheap.
__getattr__ = lazy_names(__name__, {"launcher": ("launch",)})
