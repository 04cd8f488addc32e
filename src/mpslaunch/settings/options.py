"""Every launch option and profile key, declared once.

Each `Option` names its type, its choices or check, its default, its help, whether it is a
profile key and how the command line spells it. From this table come the launch parser
(flags.py), the fields of `LaunchOptions` and `LaunchRequest` (request.py: what `launch`,
`test` and `mpslaunch.launch()` ask for) and of `Profile` (profile.py), and their checks. A new
launch option is one entry here and one field there (tests/settings/test_options.py holds the
fields to the table).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from mpslaunch import Record, record

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on every launch
if TYPE_CHECKING:
    from typing import Any

PROFILE_VERSION = 1
DEVICES = ("auto", "mps", "cuda", "cpu")
PRECISIONS = ("no", "fp16", "bf16")
RDZV_BACKENDS = ("static", "c10d")
# Accelerate's torch.compile settings (accelerate launch --dynamo_*), passed on as ACCELERATE_DYNAMO_*;
# its TPU, Neuron and HPU backends are left out: mpslaunch runs on mps, cuda or cpu.
DYNAMO_BACKENDS = (
    "no",
    "eager",
    "aot_eager",
    "inductor",
    "aot_ts_nvfuser",
    "nvprims_nvfuser",
    "cudagraphs",
    "ofi",
    "fx2trt",
    "onnxrt",
    "tensorrt",
    "tvm",
)
DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune")
TEE_VALUES = ("0", "1", "2", "3")  # torchrun's: none, stdout, stderr, both
RDZV_TIMEOUT = 900  # torchrun's own default, in seconds
RDZV_TIMEOUT_MAX = 365 * 24 * 3600  # far below what Python's and torch's timeouts can hold
# torch rejects a high watermark ratio above 2.0 (MPSAllocator.mm); 0.0 means "no limit".
MPS_WATERMARK_MAX = 2.0
DEFAULT_GRACE_SECONDS = 30.0
DEFAULT_PORT = 29500  # torchrun's and Accelerate's default port on machine 0
MANY = 65_536  # processes, machines or threads: far beyond any machine or cluster; a typo
MAX_RESTARTS = 10_000  # each restart is a new rendezvous and a new start of every rank

# --help groups, in the order they are shown.
PLAN, MACHINES, ACCELERATOR, OUTPUT, RUN = (
    "what to run on",
    "several machines (through torch.distributed.run)",
    "for the script's Accelerator (as accelerate launch sets them)",
    "output and profile",
    "",
)


# ---------------------------------------------------------------- checks of a value of the right type
# (Any: the value is already of the option's type when its check runs.)


def rule(holds: Callable[[Any], bool], wording: str) -> Callable[[Any], str | None]:
    """A check: None when `holds(value)`, else `wording` with {value} (or {quoted}) filled in."""
    return lambda value: None if holds(value) else wording.format(value=value, quoted=quoted(value))


def at_least(low: int) -> Callable[[Any], str | None]:
    return rule(lambda value: value >= low, f"must be {low} or more, not {{value}}")


def count(low: int, high: int, what: str) -> Callable[[Any], str | None]:
    """A count from `low` to `high`: above it, the number is a typo (`what`: why so many is not
    meant)."""
    too_few, too_many = (
        at_least(low),
        rule(lambda value: value <= high, f"must be at most {high:,} ({what}), not {{value}}"),
    )
    return lambda value: too_few(value) or too_many(value)


def seconds(low: float, high: float, above: bool = False) -> Callable[[Any], str | None]:
    """A number of seconds in (low, high] when `above`, else in [low, high]; nan never holds."""
    if above:
        return rule(
            lambda value: low < value <= high,
            f"must be a number of seconds above {low:g} (at most {high:.0f}), not {{value:g}}",
        )
    return rule(
        lambda value: low <= value <= high,
        f"must be a number of seconds from {low:g} to {high:.0f}, not {{value:g}}",
    )


_port = rule(
    lambda value: 0 <= value <= 65535,
    "must be a TCP port from 1 to 65535, or 0 to pick a free one, not {value}",
)
_memory_cap = rule(
    lambda value: 0.0 <= value <= MPS_WATERMARK_MAX,
    f"must be from 0.0 (no limit) to {MPS_WATERMARK_MAX} (a multiple of the GPU's "
    "recommended working set; torch rejects more), not {value}",
)
_gpu_ids = rule(
    lambda value: re.fullmatch(r"all|\d+(,\d+)*", value) is not None,
    "must be GPU numbers separated by commas, such as 0,1, or all, not{quoted}",
)
_rdzv_timeout = rule(
    lambda value: 1 <= value <= RDZV_TIMEOUT_MAX,
    f"must be from 1 to {RDZV_TIMEOUT_MAX} seconds (a year), not {{value}}",
)
_version = rule(
    lambda value: 1 <= value <= PROFILE_VERSION,
    f"is {{value}}, but this mpslaunch reads profile version {PROFILE_VERSION} at most; "
    "upgrade mpslaunch or write the profile again with `mpslaunch config`",
)


_TYPO = "far more than any machine or cluster has"


# ---------------------------------------------------------------- the table


@record
class Option(Record):
    """One launch option or profile key, as the parser, the request and the profile see it."""

    # One field a line, with what it means: the formatter leaves these lines as written.
    # fmt: off
    name: str  # the Python name, the profile key, and (as --name) the flag
    kind: type  # bool, int, float or str
    help: str = ""
    default: object = None  # the profile's default; for an option that is not a profile key, the request's
    choices: tuple[str, ...] = ()
    check: Callable[[object], str | None] | None = None  # what is wrong with a value of the right type
    profile: bool = False  # a profile key
    flag: str | None = ""  # how the command line spells it: "" for --name, None for no flag
    short: str | None = None  # a one-letter spelling, as -t for --tee
    const: object = True  # what a switch (a bool flag) sets
    metavar: str | None = None
    group: str = RUN  # where --help shows it
    request: bool = True  # a field of LaunchOptions (and a keyword of mpslaunch.launch)
    shown_default: str | None = None  # how --help names a default that is not a plain value
    accelerate: bool = False  # `accelerate launch` takes it, under this name, with this meaning
    # fmt: on

    @property
    def spelling(self) -> str | None:
        return None if self.flag is None else self.flag or f"--{self.name}"

    @property
    def nullable(self) -> bool:
        return self.default is None

    @property
    def types(self) -> tuple[type, ...]:
        """The Python types a value may have: bool is not an int, an int is taken as a float."""
        return (
            self.kind,
            *((int,) if self.kind is float else ()),
            *((type(None),) if self.nullable else ()),
        )

    @property
    def request_default(self) -> object:
        """Not given: None for a profile key (the profile decides), else the option's default."""
        return None if self.profile else self.default

    def problem(self, value: object) -> str | None:
        """Why `value` is not allowed, or None. Shared by files, flags, the API and the questions."""
        if not has_type(value, self.types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in self.types)
            return f"must be {wanted}, not {type_name(value)}{quoted(value)}"
        if value is None:
            return None
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}, not{quoted(value)}"
        return self.check(value) if self.check else None

    def parse(self, text: str) -> object:
        """The value a command-line word stands for (ValueError when it stands for none), checked:
        ValueError("--name why") when the table refuses it."""
        value = text if self.kind is str else self.kind(text)
        problem = self.problem(value)
        if problem:
            raise ValueError(f"{self.spelling} {problem}")
        return value


# The table, an option to a row or two: the formatter leaves it as written.
# fmt: off
OPTIONS = (
    Option("version", int, default=PROFILE_VERSION, check=_version, profile=True, flag=None,
           request=False),
    Option("cpu", bool, "run on the CPU whatever the machine has", default=False, group=PLAN,
           accelerate=True),
    Option("device", str, "the device to train on: auto picks mps on Apple silicon, then cuda, then cpu",
           default="auto", choices=DEVICES, profile=True, group=PLAN),
    Option("mixed_precision", str, "mixed precision", default="no", choices=PRECISIONS,
           profile=True, group=PLAN, accelerate=True),
    Option("num_processes", int, "processes on this machine", check=count(1, MANY, _TYPO),
           profile=True, metavar="N", group=PLAN, shown_default="one per NVIDIA GPU, else 1",
           accelerate=True),
    Option("num_machines", int, "how many machines take part", default=1,
           check=count(1, MANY, _TYPO), profile=True, metavar="MACHINES", group=MACHINES,
           accelerate=True),
    Option("machine_rank", int, "this machine's rank, from 0", default=0,
           check=count(0, MANY - 1, _TYPO), profile=True, metavar="RANK", group=MACHINES,
           accelerate=True),
    Option("main_process_ip", str, "address of machine 0", profile=True, metavar="IP",
           group=MACHINES, shown_default="none", accelerate=True),
    Option("main_process_ip_via_nat", bool,
           "on machine 0: the main address reaches it through NAT or port forwarding, so it is not "
           "one of its own (the rendezvous then listens on every interface)",
           default=False, profile=True, group=MACHINES),
    Option("main_process_port", int, "port on machine 0 (0: pick a free one)", default=0,
           check=_port, profile=True, metavar="PORT", group=MACHINES, accelerate=True),
    Option("rdzv_backend", str, "rendezvous", default="static", choices=RDZV_BACKENDS,
           profile=True, group=MACHINES, accelerate=True),
    Option("rdzv_timeout", int, "how long the machines wait for each other before giving up, "
           "as torchrun", default=RDZV_TIMEOUT, check=_rdzv_timeout, profile=True,
           metavar="SECONDS", group=MACHINES),
    Option("max_restarts", int, "restarts of the worker group after a failure", default=0,
           check=count(0, MAX_RESTARTS, "each one starts every rank again"), profile=True,
           metavar="RESTARTS", group=MACHINES, accelerate=True),
    # Inside an srun step, SLURM's variables say the machines, this one's rank and machine 0.
    Option("slurm", bool, "ignore SLURM: do not read the machines and ranks from the srun step "
           "(docs/several-machines.md)", default=True, profile=True, flag="--no_slurm",
           const=False, group=MACHINES),
    Option("monitor_interval", float, "how often torch checks the ranks",
           check=seconds(0, 3600, above=True), metavar="SECONDS", group=MACHINES,
           shown_default="0.1", accelerate=True),
    # PYTORCH_ENABLE_MPS_FALLBACK: run ops without an MPS kernel on the CPU.
    Option("mps_fallback", bool, default=True, profile=True, flag=None, request=False),
    Option("mps_memory_cap", float, check=_memory_cap, profile=True, flag=None,  # PYTORCH_MPS_HIGH_WATERMARK_RATIO
           request=False),
    Option("gpu_ids", str, "NVIDIA GPUs to use, such as 0,1 (CUDA_VISIBLE_DEVICES for the ranks)",
           check=_gpu_ids, profile=True, metavar="IDS", group=PLAN, shown_default="all",
           accelerate=True),
    Option("multi_gpu", bool, "check that the plan is several GPUs (it is by default where there are)",
           default=False, group=PLAN, accelerate=True),
    Option("dynamo_backend", str, "torch.compile backend", default="no", choices=DYNAMO_BACKENDS,
           profile=True, metavar="BACKEND", group=ACCELERATOR, accelerate=True),
    Option("dynamo_mode", str, "torch.compile mode", default="default", choices=DYNAMO_MODES,
           profile=True, metavar="MODE", group=ACCELERATOR, accelerate=True),
    Option("dynamo_use_fullgraph", bool, "compile the whole graph, no graph breaks", default=False,
           profile=True, group=ACCELERATOR, accelerate=True),
    Option("dynamo_use_dynamic", bool, "trace dynamic shapes", default=False, profile=True,
           group=ACCELERATOR, accelerate=True),
    Option("dynamo_use_regional_compilation", bool, "compile repeated blocks once", default=False,
           profile=True, group=ACCELERATOR, accelerate=True),
    Option("debug", bool, "ACCELERATE_DEBUG_MODE: check collective operations", default=False,
           profile=True, group=ACCELERATOR, accelerate=True),
    Option("num_cpu_threads_per_process", int, "threads each process uses (OMP_NUM_THREADS)",
           check=count(1, MANY, _TYPO), metavar="N", group=ACCELERATOR,
           shown_default="cores / processes",
           accelerate=True),
    Option("log_dir", str, "also write the output (each rank's, with several) to files in DIR",
           metavar="DIR", group=OUTPUT, shown_default="none"),
    Option("tee", str, "accepted for Accelerate: every rank's output always reaches the console",
           choices=TEE_VALUES, short="-t", metavar="0-3", group=OUTPUT, shown_default="none",
           accelerate=True),
    Option("quiet", bool, "no plan line or check warnings before the run, no memory warning, "
           "no line at its end", default=False, short="-q", group=OUTPUT, request=False),
    Option("check", bool, "do not read the script first for what breaks it on this plan "
           "(`mpslaunch check`)", default=True, profile=True, flag="--no_check", const=False,
           group=OUTPUT),
    # On macOS, caffeinate -i holds off idle sleep while the run lasts (run/awake.py).
    Option("keep_awake", bool, "on a Mac, let it sleep during the run (by default caffeinate "
           "keeps it awake)", default=True, profile=True, flag="--no_keep_awake", const=False,
           group=OUTPUT),
    Option("profile", str, "the profile NAME.yaml in the config folder (default: default.yaml)",
           metavar="NAME", group=OUTPUT, request=False),
    Option("config_file", str, "a profile file anywhere (or an Accelerate config file)",
           metavar="PATH", group=OUTPUT, request=False, accelerate=True),
    Option("grace_period", float, "after Ctrl-C or SIGTERM, how long the script may take to stop",
           default=DEFAULT_GRACE_SECONDS, check=seconds(0, threading.TIMEOUT_MAX),
           metavar="SECONDS"),
    Option("dry_run", bool, "print the plan and run nothing", default=False, request=False),
    Option("module", bool, "the target is a module name, run as python -m", default=False,
           short="-m", accelerate=True),
    Option("no_python", bool, "run the target itself (an executable), not with python",
           default=False, accelerate=True),
)
# fmt: on
BY_NAME = {option.name: option for option in OPTIONS}
REQUEST_OPTIONS = tuple(option for option in OPTIONS if option.request)
PROFILE_OPTIONS = tuple(option for option in OPTIONS if option.profile)


# ---------------------------------------------------------------- how a message shows a value


def has_type(value: object, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def quoted(value: object) -> str:
    """The value as a message may quote it: scalars only, cut short. A list or mapping is not
    quoted: through YAML aliases a few hundred bytes can name billions of items."""
    if isinstance(value, (list, dict, set, tuple)):
        return ""
    return " " + cut(repr(value))


def cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
