"""mpslaunch: launch PyTorch training on your own machine, Apple silicon first."""

from __future__ import annotations

__version__ = "0.1.0"

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on every launch
if TYPE_CHECKING:
    from typing import Any, ClassVar, TypeVar

    from typing_extensions import Self, dataclass_transform

    _Class = TypeVar("_Class")
else:

    def dataclass_transform(**_):  # typing's marker for type checkers; nothing at run time
        return lambda function: function


class Record(tuple):
    """A record's base (`@record class Name(Record):`): a tuple of its fields with what a
    namedtuple has (`_replace`, `_asdict`, `_make`, its repr, pickling), written once here, so
    that defining a record compiles nothing."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _field_defaults: ClassVar[dict[str, Any]] = {}
    _field_fills: ClassVar[tuple[Any, ...]] = ()  # each field's default, else _MISSING

    def __new__(cls, *values: Any, **fields: Any) -> Self:
        """Made as namedtuple's are: by position in the fields' order, or by name; a field
        left out takes its default."""
        names = cls._fields
        given = len(values)
        if fields or given != len(names):
            if given > len(names):
                raise TypeError(_wrong_call(cls, given, fields))
            full = [*values, *cls._field_fills[given:]]
            for name, value in fields.items():
                try:
                    full[names.index(name, given)] = value
                except ValueError:  # no field's name, or a field given by position too
                    raise TypeError(_wrong_call(cls, given, fields)) from None
            required = len(names) - len(cls._field_defaults)
            if given < required and any(value is _MISSING for value in full[given:required]):
                raise TypeError(_wrong_call(cls, given, fields))
            return tuple.__new__(cls, full)
        return tuple.__new__(cls, values)

    @classmethod
    def _make(cls, values: Any) -> Self:
        """The record of these values, in the fields' order."""
        made = tuple.__new__(cls, values)
        if len(made) != len(cls._fields):
            raise TypeError(f"Expected {len(cls._fields)} arguments, got {len(made)}")
        return made

    def _replace(self, **changes: Any) -> Self:
        """A copy with these fields changed; the class's own `__new__` is not called again."""
        made = tuple.__new__(type(self), map(changes.pop, self._fields, self))
        if changes:
            raise ValueError(f"Got unexpected field names: {list(changes)!r}")
        return made

    def _asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={value!r}" for name, value in zip(self._fields, self, strict=True)
        )
        return f"{type(self).__name__}({shown})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Unpickled and copied through tuple's `__new__`, not the class's: a record whose
        `__new__` takes names only is copied too. A subclass's attributes (a `__dict__`)
        come along."""
        return tuple.__new__, (type(self), tuple(self)), getattr(self, "__dict__", None) or None


_MISSING = object()  # a field neither given nor with a default
_FIELD_GETTERS: list[property] = []  # field i's, shared by every record


def _wrong_call(cls: type[Record], given: int, fields: dict[str, Any]) -> str:
    """What Python says of the same call to namedtuple's `__new__`, in the same order: a
    keyword, the count of positional values, the fields missing."""
    names = cls._fields
    required = len(names) - len(cls._field_defaults)
    owner = next(kind for kind in cls.__mro__ if "_fields" in kind.__dict__)
    call = f"{owner.__name__}.__new__()"
    wrong = [name for name in fields if name not in names[given:]]
    if wrong:
        if wrong[0] in names:
            return f"{call} got multiple values for argument {wrong[0]!r}"
        return f"{call} got an unexpected keyword argument {wrong[0]!r}"
    most = len(names) + 1  # with cls
    if given > len(names):
        takes = f"from {required + 1} to {most}" if required < len(names) else str(most)
        plural = "" if takes == "1" else "s"
        return f"{call} takes {takes} positional argument{plural} but {given + 1} were given"
    missing = [repr(name) for name in names[given:required] if name not in fields]
    listed = " and ".join(missing) if len(missing) < 3 else ", ".join(missing[:-1])
    listed += f", and {missing[-1]}" if len(missing) > 2 else ""
    plural = "" if len(missing) == 1 else "s"
    return f"{call} missing {len(missing)} required positional argument{plural}: {listed}"


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
    tuple of its fields, as a namedtuple is: defining a dataclass compiles several functions,
    which every launch would pay for, and `dataclasses` imports `inspect`; a namedtuple compiles
    its `__new__`. Here every record shares Record's methods, and a field is a property reading
    its item. Written `@record class Name(Record):`, or with the record it subclasses as base,
    whose fields come first; fields with defaults come last. Its values: `_replace(...)`,
    `_fields`, `_field_defaults`, `_asdict()`, and the annotations (as written) in
    `__annotations__`."""
    base: Any = next((base for base in cls.__bases__ if issubclass(base, Record)), None)
    if base is None:
        raise TypeError(f"{cls.__name__}: a record derives from Record or from another record")
    annotations = cls.__dict__.get("__annotations__", {})
    own = tuple(annotations)
    names = (*base._fields, *own)
    if len(set(names)) != len(names) or any(name.startswith("_") for name in own):
        raise TypeError(f"{cls.__name__}: a field repeats its base's, or starts with _")
    defaults = {  # in the fields' order, where they are the last fields
        **base._field_defaults,
        **{name: cls.__dict__[name] for name in own if name in cls.__dict__},
    }
    required = len(names) - len(defaults)
    if set(names[required:]) != defaults.keys():
        raise TypeError(f"{cls.__name__}: a field without a default follows one with a default")
    namespace = {
        key: value
        for key, value in cls.__dict__.items()
        if key not in annotations and key not in ("__dict__", "__weakref__")
    }
    from operator import itemgetter  # already imported by subprocess

    while len(_FIELD_GETTERS) < len(names):
        index = len(_FIELD_GETTERS)
        _FIELD_GETTERS.append(property(itemgetter(index), doc=f"Alias for field number {index}"))
    made = type(
        cls.__name__,
        cls.__bases__,
        {
            **namespace,
            **dict(zip(own, _FIELD_GETTERS[len(base._fields) : len(names)], strict=True)),
            "__slots__": (),
            "_fields": names,
            "_field_defaults": defaults,
            "_field_fills": (_MISSING,) * required + tuple(defaults.values()),
            "__match_args__": names,
        },
    )
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
