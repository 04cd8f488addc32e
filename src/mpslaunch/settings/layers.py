"""Settings in layers, each value with where it came from.

A layer is what one source says about the profile keys: a profile file (an mpslaunch profile,
or an Accelerate config read as one), the command line, `mpslaunch.launch()`'s keywords, or a
cluster (a scheduler's variables, read in machine/ and made a layer in plan/). `merge` puts
them on top of the defaults, the weaker first: a later layer's value wins over an earlier
one's. A cluster's values are facts about this run rather than wishes: a value that
contradicts one is refused, naming both values and where each came from; a value that agrees
is taken; a key nobody else set is filled. The result, `Settings`, is the run's profile and
each value's layer, so that every message names a value as it was given (`--num_processes 2`,
`num_processes: 2 in FILE`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from mpslaunch import Record, record
from mpslaunch.output import MpslaunchError
from mpslaunch.settings.options import BY_NAME
from mpslaunch.settings.profile import KNOWN_KEYS, Profile

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on every launch
if TYPE_CHECKING:
    from typing import Any

    from mpslaunch.settings.profile_files import ProfileFile
    from mpslaunch.settings.request import LaunchOptions

# The kinds of layer, as --dry_run names where a value came from.
DEFAULT = "default"
PROFILE = "profile"
ACCELERATE = "Accelerate config"
COMMAND_LINE = "command line"
API = "mpslaunch.launch()"
CLUSTER = "cluster"

_NO_WORDS: Mapping[str, tuple[str, str]] = MappingProxyType({})


# What one source says: the profile keys it sets and their values.
#   kind    DEFAULT, PROFILE, ACCELERATE, COMMAND_LINE, API or CLUSTER
#   values  {profile key: value} for the keys it sets
#   where   the file a profile was read from; a cluster's name (`SLURM`)
#   words   {key: (the value named, with {value}; where it came from)} where the kind's words
#           are not right: a cluster's ("SLURM's node rank {value} (SLURM_NODEID)",
#           "SLURM_NODEID"); the command line's device set by a switch ("--cpu", "--cpu")
#   escape  a cluster's: how to run without it (`give --no_slurm to ignore SLURM`)
@record
class Layer(Record):
    kind: str
    values: Mapping[str, Any]
    where: str = ""
    words: Mapping[str, tuple[str, str]] = _NO_WORDS
    escape: str = ""


_DEFAULTS = Layer(DEFAULT, MappingProxyType({}))


class Settings(Profile):
    """The profile a run uses, after every layer, with the layer each value came from. A value a
    rule derives (the process count one per GPU, an address in one spelling) keeps its layer
    (`replace`). A plain subclass, not a second dataclass, which every launch would pay for
    defining; equality is the profile's, whatever the origins."""

    origins: Mapping[str, Layer] = MappingProxyType({})  # each key's layer; absent: the defaults

    @classmethod
    def of(cls, values: Mapping[str, Any], origins: Mapping[str, Layer]) -> Settings:
        settings = cls(**values)
        object.__setattr__(settings, "origins", origins)  # frozen, as the profile is
        return settings

    def replace(self, **changes: object) -> Settings:
        return Settings.of({**self.to_dict(), **changes}, self.origins)

    def layer(self, key: str) -> Layer:
        return self.origins.get(key, _DEFAULTS)

    def kind(self, key: str) -> str:
        return self.layer(key).kind

    def origin(self, key: str) -> str:
        """Where the value came from: `--num_processes`, `profile FILE`, `default`, ..."""
        return origin(self.layer(key), key)

    def named(self, key: str) -> str:
        """The value as it was given, so that the user finds it: `--num_processes 2`,
        `num_processes: 2 in FILE`, `num_processes=2` (mpslaunch.launch()), or
        `num_processes 1 (default)`."""
        return named(self.layer(key), key, getattr(self, key))


def merge(*layers: Layer) -> Settings:
    """The defaults, then each layer over the ones before it; a cluster's values are facts (see
    the module's docstring). MpslaunchError for a value that contradicts a fact."""
    values: dict[str, object] = {}
    origins: dict[str, Layer] = {}
    for layer in layers:
        for key, value in layer.values.items():
            held = origins.get(key, _DEFAULTS)
            if CLUSTER in (held.kind, layer.kind) and held.kind != DEFAULT and values[key] != value:
                raise MpslaunchError(_contradiction(key, (held, values[key]), (layer, value)))
            if held.kind == CLUSTER and layer.kind != CLUSTER:
                continue  # it agrees: the fact stays where the value came from
            values[key], origins[key] = value, layer
    return Settings.of(values, origins)


def _contradiction(key: str, earlier: tuple[Layer, object], later: tuple[Layer, object]) -> str:
    later_is_fact = later[0].kind == CLUSTER
    (given, value), (fact, truth) = (earlier, later) if later_is_fact else (later, earlier)
    ways = [way for way in (_without(given, key), fact.escape) if way]
    return f"{named(given, key, value)} contradicts {named(fact, key, truth)}; " + ", or ".join(
        ways
    )


def _without(layer: Layer, key: str) -> str:
    """How the user takes back a value this layer gave."""
    if layer.kind == COMMAND_LINE:
        return f"drop {origin(layer, key)}"
    if layer.kind == API:
        return f"drop {key}="
    if layer.kind in (PROFILE, ACCELERATE) and layer.where:
        return f"drop {key} from {layer.where}"
    return layer.escape


# ---------------------------------------------------------------- how a message names a value


def origin(layer: Layer, key: str) -> str:
    if key in layer.words:
        return layer.words[key][1]
    if layer.kind == COMMAND_LINE:
        return BY_NAME[key].spelling or f"--{key}"
    if layer.kind in (PROFILE, ACCELERATE, CLUSTER) and layer.where:
        return layer.where if layer.kind == CLUSTER else f"{layer.kind} {layer.where}"
    return layer.kind


def named(layer: Layer, key: str, value: object) -> str:
    if key in layer.words:
        return layer.words[key][0].format(value=value)
    if layer.kind == COMMAND_LINE:
        spelling = origin(layer, key)
        return spelling if isinstance(value, bool) else f"{spelling} {value}"
    if layer.kind == API:
        return f"{key}={value!r}"
    if layer.kind == PROFILE:
        return f"{key}: {_yaml(value)} in {layer.where or 'the profile'}"
    if layer.kind == ACCELERATE:
        return f"{key}: {_yaml(value)} from the Accelerate config {layer.where}"
    if layer.kind == CLUSTER:
        return f"{key} {value} from {layer.where}"
    return f"{key} {_yaml(value)} (default)"


def _yaml(value: object) -> str:
    """A value as the profile file writes it."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


# ---------------------------------------------------------------- the user's layers


def profile_layer(
    profile: Profile, where: str = "", keys: tuple[str, ...] | None = None, kind: str = PROFILE
) -> Layer:
    """A profile's values: those of `keys` (what its file sets), else those that differ from the
    defaults (a Profile made in Python, with no file behind it)."""
    if keys is None:
        default = Profile()
        keys = tuple(key for key in KNOWN_KEYS if getattr(profile, key) != getattr(default, key))
    return Layer(kind, {key: getattr(profile, key) for key in keys}, where)


def file_layer(loaded: ProfileFile) -> Layer:
    """The profile file in force: an mpslaunch profile or an Accelerate config, with its path;
    no file, no values."""
    if loaded.path is None:
        return Layer(PROFILE, MappingProxyType({}))
    return profile_layer(
        loaded.profile,
        str(loaded.path),
        KNOWN_KEYS if loaded.keys is None else loaded.keys,
        ACCELERATE if loaded.translation else PROFILE,
    )


def options_layer(options: LaunchOptions, kind: str = COMMAND_LINE) -> Layer:
    """The profile keys the request gives (COMMAND_LINE, or API for mpslaunch.launch()'s keywords);
    --cpu is device cpu."""
    values = {
        key: getattr(options, key) for key in KNOWN_KEYS if getattr(options, key, None) is not None
    }
    if not options.cpu:
        return Layer(kind, values)
    cpu, device = (
        ("cpu=True", f"device={options.device!r}")
        if kind == API
        else ("--cpu", f"--device {options.device}")
    )
    if options.device not in (None, "cpu"):
        raise MpslaunchError(f"{cpu} and {device} contradict each other; give one")
    values["device"] = "cpu"
    return Layer(kind, values, words={"device": (cpu, cpu if kind == COMMAND_LINE else API)})
