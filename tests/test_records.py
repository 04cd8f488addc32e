"""`mpslaunch.record`: a class written as a frozen dataclass becomes a tuple of its fields that
behaves as the namedtuple of those fields does (made, compared, copied, pickled, printed, its
errors), without compiling anything when it is defined."""

from __future__ import annotations

import builtins
import copy
import itertools
import marshal
import pickle
from collections import namedtuple

import pytest

from mpslaunch import Record, record
from mpslaunch.machine.torch_check import MpsAnswer
from mpslaunch.settings import LaunchOptions, LaunchRequest, Profile, merge


@record
class Point(Record):
    """A point, with a method."""

    x: int
    y: int = 0
    label: str = "p"

    def size(self) -> int:
        return abs(self.x) + abs(self.y)

    @classmethod
    def origin(cls) -> Point:
        return cls(0)


@record
class Point3(Point):
    """A record subclassing a record: its fields come after the base's; super() in a method, a
    property and a classmethod."""

    z: int = 0

    def size(self) -> int:
        return super().size() + abs(self.z)

    @property
    def flat_size(self) -> int:
        return super().size()

    @classmethod
    def origin(cls) -> Point3:
        return super().origin()._replace(label="o")


@record
class ByName(Record):
    """Made by name only, as LaunchOptions and LaunchPlan are."""

    first: int
    second: str = "two"

    def __new__(cls, **fields: object):
        return super().__new__(cls, **fields)


class Tagged(Point):
    """A plain subclass with attributes of its own, as Settings is of Profile."""

    tag: str = ""


# The namedtuple twin of Point: what every Point must match.
Twin = namedtuple("Point", "x y label", defaults=(0, "p"))


def shaped(fields: int, defaults: int, inherited: int) -> tuple[type, type]:
    """A record of `fields` fields, the last `defaults` with defaults, the first `inherited` of
    them from a base record; and its namedtuple twin."""
    names = [f"f{number}" for number in range(fields)]
    values = {name: f"default {name}" for name in names[fields - defaults :]}

    def body(own: list[str]) -> dict:
        return {"__annotations__": dict.fromkeys(own, "int")} | {
            name: values[name] for name in own if name in values
        }

    base = record(type("Base", (Record,), body(names[:inherited])))
    made = record(type("Shaped", (base,), body(names[inherited:])))
    return made, namedtuple("Shaped", names, defaults=list(values.values()))


def outcome(kind: type, args: tuple, keywords: dict):
    try:
        return "made", tuple(kind(*args, **keywords))
    except TypeError as error:
        return "TypeError", str(error)


def test_a_record_is_a_tuple_of_its_fields():
    point = Point(1, 2)
    assert isinstance(point, tuple) and isinstance(point, Record)
    assert (point.x, point.y, point.label) == (1, 2, "p") == tuple(point)
    assert point[0] == 1 and point[-1] == "p" and point[:2] == (1, 2) and len(point) == 3
    x, y, label = point
    assert (x, y, label) == (1, 2, "p")
    assert point == (1, 2, "p") == Twin(1, 2) and hash(point) == hash((1, 2, "p"))
    assert Point(1, 2) < Point(1, 3) and sorted([Point(2), Point(1)]) == [(1, 0, "p"), (2, 0, "p")]
    assert {Point(1): "one"}[(1, 0, "p")] == "one"
    assert point.size() == 3 and Point.__doc__ == "A point, with a method."


def test_fields_are_read_only_and_instances_have_no_dict():
    point = Point(1)
    with pytest.raises(AttributeError):
        point.x = 5
    with pytest.raises(AttributeError):
        point.other = 5
    assert not hasattr(point, "__dict__") and Point.__slots__ == () == Point3.__slots__


@pytest.mark.parametrize(
    "fields, defaults, inherited",
    [(n, d, i) for n in range(5) for d in range(n + 1) for i in sorted({0, n // 2, n})],
)
def test_every_call_makes_what_namedtuple_makes_or_raises_its_typeerror(
    fields, defaults, inherited
):
    """Every mix of positional values and keywords (fields, unknown names, repeats, in either
    order), on records of 0 to 4 fields, some from a base record: the same values, or the same
    TypeError word for word."""
    made, twin = shaped(fields, defaults, inherited)
    keywords = [None, "f0", "f1", "f3", "zz", "yy"]
    for given in range(fields + 2):
        for first, second in itertools.product(keywords, repeat=2):
            named = {name: name.upper() for name in (first, second) if name}
            args = tuple(range(given))
            assert outcome(made, args, named) == outcome(twin, args, named), (args, named)


def test_the_typeerrors_name_the_record():
    with pytest.raises(TypeError, match=r"^Point.__new__\(\) missing 1 required positional "):
        Point()
    with pytest.raises(TypeError, match=r"^Point3.__new__\(\) got an unexpected keyword .*'w'"):
        Point3(1, w=2)
    with pytest.raises(TypeError, match=r"^ByName.__new__\(\) got an unexpected keyword .*'x'"):
        ByName(first=1, x=2)
    with pytest.raises(TypeError, match="missing 4 required positional arguments"):
        MpsAnswer()  # what torch_check expects of a kept entry of another shape


def test_the_namedtuple_api():
    point = Point(1, label="q")
    assert Point._fields == Twin._fields == ("x", "y", "label")
    assert Point._field_defaults == Twin._field_defaults == {"y": 0, "label": "p"}
    assert Point.__match_args__ == Twin.__match_args__
    assert point._asdict() == Twin(1, label="q")._asdict() == {"x": 1, "y": 0, "label": "q"}
    assert repr(point) == repr(Twin(1, label="q")) == "Point(x=1, y=0, label='q')"
    assert point._replace(y=5) == (1, 5, "q") and type(point._replace()) is Point
    assert Point._make([3, 4, "r"]) == Point(3, 4, "r") and type(Point._make((3, 4, "r"))) is Point
    with pytest.raises(ValueError) as ours:
        point._replace(w=1)
    with pytest.raises(ValueError) as theirs:
        Twin(1)._replace(w=1)
    assert str(ours.value) == str(theirs.value) == "Got unexpected field names: ['w']"
    with pytest.raises(TypeError, match="Expected 3 arguments, got 2"):
        Point._make([1, 2])
    assert Point.__annotations__ == {"x": "int", "y": "int", "label": "str"}
    match point:
        case Point(x, y, label):
            assert (x, y, label) == (1, 0, "q")


def test_a_subclass_record_has_its_base_fields_first_and_super_finds_the_class_made():
    point = Point3(1, 2, z=-3)
    assert Point3._fields == ("x", "y", "label", "z") and point == (1, 2, "p", -3)
    assert list(Point3._field_defaults.items()) == [("y", 0), ("label", "p"), ("z", 0)]
    assert Point3.__annotations__ == {"z": "int"}  # its own, as written
    assert isinstance(point, Point) and repr(point) == "Point3(x=1, y=2, label='p', z=-3)"
    assert point.size() == 6 and point.flat_size == 3 and Point3.origin() == (0, 0, "o", 0)
    assert point._replace(z=4).size() == 7


def test_a_record_made_by_name_only_and_replace_that_skips_its_new():
    made = ByName(first=1)
    assert made == (1, "two") and made._replace(second="2") == (1, "2")
    with pytest.raises(TypeError):
        ByName(1)


@pytest.mark.parametrize(
    "value",
    [
        Point(1, 2),
        Point3(1, z=3),
        ByName(first=1),
        LaunchOptions(cpu=True, num_processes=2),
        LaunchRequest("train.py", ("--epochs", "2"), cpu=True),
        Profile(device="cpu"),
    ],
    ids=lambda value: type(value).__name__,
)
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_records_pickle_and_copy(value, protocol):
    """Records cross to processes that spawn starts by pickle; one made by name only too."""
    for again in (
        pickle.loads(pickle.dumps(value, protocol)),
        copy.copy(value),
        copy.deepcopy(value),
    ):
        assert again == value and type(again) is type(value)
    assert marshal.loads(marshal.dumps(value._asdict())) == value._asdict()


def test_a_subclass_with_its_own_attributes_pickles_them():
    tagged = Tagged(1, 2)
    object.__setattr__(tagged, "tag", "kept")  # frozen, as Settings sets its origins
    for again in (pickle.loads(pickle.dumps(tagged)), copy.copy(tagged), copy.deepcopy(tagged)):
        assert again == tagged and type(again) is Tagged and again.tag == "kept"
    settings = merge()
    assert pickle.loads(pickle.dumps(settings)).origins == settings.origins


def test_defining_a_record_compiles_nothing(monkeypatch):
    """The reason records are not namedtuples: namedtuple compiles each one's __new__."""
    compiled = []

    def counted(real):
        def call(*args, **kwargs):
            compiled.append(real.__name__)
            return real(*args, **kwargs)

        return call

    with monkeypatch.context() as patched:
        for name in ("eval", "exec", "compile"):
            patched.setattr(builtins, name, counted(getattr(builtins, name)))
        made = record(type("Made", (Point,), {"__annotations__": {"w": "int"}, "w": 0}))
    assert compiled == [] and made(1, w=2) == (1, 0, "p", 2)


@pytest.mark.parametrize(
    "base, body, why",
    [
        (Record, {"__annotations__": {"a": "int", "b": "int"}, "a": 1}, "without a default"),
        (Point, {"__annotations__": {"z": "int"}}, "without a default"),
        (Point, {"__annotations__": {"y": "int"}, "y": 1}, "repeats"),
        (Record, {"__annotations__": {"_a": "int"}}, "starts with _"),
        (object, {"__annotations__": {"a": "int"}}, "derives from Record"),
    ],
)
def test_a_record_written_wrong_is_refused_when_defined(base, body, why):
    with pytest.raises(TypeError, match=why):
        record(type("Wrong", (base,), body))
