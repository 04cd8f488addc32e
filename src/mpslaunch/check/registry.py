"""The rules, each declared once: its name, the plans it applies to, what it looks for, what it
says happens and what to write instead. docs/check.md's table is held to these declarations
(tests/check/test_check_registry.py); the code that decides where a rule speaks registers itself
here under the rule's name (`implements`), and the walk hands it only what its declaration
asks for. The kept findings (cache.py) are keyed on this package's source files, so a rule
added or changed means a fresh check of a script seen before.

A message or a fix is a template (`str.format` fields the rule fills in, and `device`, `on`,
`device_fix` from the plan); a mapping of templates by device where the plan changes the words.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping
from functools import partial

from mpslaunch import Record, record
from mpslaunch.check.target import Target

SCRIPTS_FOR_CUDA = "Scripts written for CUDA"  # docs/mps-facts.md sections
PRECISION = "Precision"
WORKERS = "DataLoader workers"

Text = str | Mapping[str, str]  # one template, or one per device ("mps", "cpu")


class Plans(namedtuple("Plans", "shown devices several", defaults=(False,))):
    """The plans a rule applies to (`devices`; only several processes when `several`), and how
    docs/check.md's table names them (`shown`)."""

    __slots__ = ()

    def applies(self, target: Target) -> bool:
        return target.device in self.devices and (not self.several or target.processes > 1)


MPS = Plans("mps", ("mps",))
NO_CUDA = Plans("mps, cpu", ("mps", "cpu"))
SEVERAL_CPU = Plans("cpu, several processes", ("mps", "cpu"), several=True)
# Workers start by spawn where the system's default says so, or where the script asks for it.
WORKERS_SPAWNED = Plans("macOS; Linux with Python 3.14", ("mps", "cpu", "cuda"))


@record
class Rule(Record):
    """One rule, declared once (a record: cheap to import at every launch)."""

    name: str  # short and stable, for tools (--json)
    plans: Plans
    looks_for: str  # in words
    calls: tuple[str, ...]  # the calls handed to it, by the name they end with ("*": all)
    words: tuple[str, ...]  # what a line it can be about spells (selection.py reads only those)
    messages: Mapping[str, Text]  # what happens, by kind of finding
    fixes: Mapping[str, Text]  # what to write instead, by kind of finding
    breaks: bool = True  # the run stops (else it runs, but not as written)
    fact: str = SCRIPTS_FOR_CUDA  # the docs/mps-facts.md section it rests on
    branches: bool = False  # also handed each if and conditional expression

    def text(
        self, texts: Mapping[str, Text], kind: str, device: str, fields: Mapping[str, object]
    ) -> str:
        template = texts[kind]
        if not isinstance(template, str):
            template = template[device]
        return template.format(**fields)


_NO_CUDA_HERE = {
    "mps": 'it fails on a Mac, where torch has no CUDA ("Torch not compiled with CUDA enabled")',
    "cpu": "it puts work on cuda, but the plan is cpu",
}
_MAP_CPU = 'write map_location="cpu" (then move the model to the device)'
_DESERIALIZE = '("Attempting to deserialize object on a CUDA device")'
_MPS_FLOAT64 = "Cannot convert a MPS Tensor to float64 dtype"
_PICKLE = 'and the run stops ("Can\'t pickle ...")'

RULES: tuple[Rule, ...] = (
    Rule(
        "cpu-fallback",
        MPS,
        "a device chosen between cuda and the CPU, with no mps branch",
        ("*",),
        ("cuda",),
        {
            "choice": "`{shown}` leaves the work on the CPU on a Mac: the script trains on the CPU, "
            "many times slower, and the plan's mps is not used"
        },
        {
            "plain": 'write torch.device(os.environ.get("MPSLAUNCH_DEVICE", "cpu")), or give the '
            "choice an elif torch.backends.mps.is_available() branch",
            "accelerate": "use accelerator.device",
        },
        breaks=False,
        branches=True,
    ),
    Rule(
        "cuda-default",
        NO_CUDA,
        'an option or a module setting whose default is "cuda"',
        ("add_argument",),
        ("add_argument", "cuda"),
        {
            "option": {
                device: '{option} defaults to "{value}": ' + fails
                for device, fails in _NO_CUDA_HERE.items()
            },
            "module": {
                device: '{name} = "{value}" is the default, which only a config file run by '
                "exec() may change: unless it does, " + fails
                for device, fails in _NO_CUDA_HERE.items()
            },
        },
        {
            "option": "pass {option} {device}",
            "module": 'set {name} to "{device}" in the config, or write {name} = '
            'os.environ.get("MPSLAUNCH_DEVICE", "cpu")',
        },
    ),
    Rule(
        "cuda-device",
        NO_CUDA,
        "work put on cuda: .cuda(), a cuda device, torch.cuda calls that need one",
        ("*",),
        ("cuda",),
        {
            "cuda": {
                "mps": '{what} fails on a Mac, where torch has no CUDA ("Torch not compiled with '
                'CUDA enabled")',
                "cpu": "{what} puts work on cuda, but the plan is cpu: without an NVIDIA GPU it "
                'fails ("Found no NVIDIA driver"), with one it runs outside the plan',
            }
        },
        {"method": "write .to(device) with device = {device_fix}", "other": "use {device_fix}"},
    ),
    Rule(
        "load-map-location",
        NO_CUDA,
        "torch.load without map_location, or with one on cuda",
        ("load",),
        ("load(", "save("),
        {
            "named": "torch.load with map_location={text} puts the checkpoint on cuda, which fails {on} "
            + _DESERIALIZE,
            "missing": "torch.load without map_location: a checkpoint saved from cuda tensors fails to "
            "load {on} " + _DESERIALIZE,
        },
        {"named": _MAP_CPU, "missing": _MAP_CPU},
    ),
    Rule(
        "float64-mps",
        MPS,
        "float64 tensors on the device, float64 as the default dtype",
        ("*",),
        ("double", "float64", "set_default"),
        {
            "default": "float64 as the default dtype: every new float tensor is float64, which mps "
            f'does not have, so moving them to mps fails ("{_MPS_FLOAT64}")',
            "tensor": f'float64 on mps: torch raises "{_MPS_FLOAT64}"',
        },
        {
            "default": "drop it (float32 is the default), or keep float64 work on the CPU",
            "tensor": "use float32 (.float(), dtype=torch.float32), and float64 only on the CPU "
            "(.cpu().double())",
        },
        fact=PRECISION,
    ),
    Rule(
        "workers-main-guard",
        WORKERS_SPAWNED,
        "a DataLoader with workers in a script without a main guard",
        ("DataLoader",),
        ("DataLoader",),
        {
            "guard": "DataLoader in a script without a main guard: its {started}, each runs this "
            'script again, and the run stops ("An attempt has been made to start a new process '
            'before the current process has finished its bootstrapping phase")'
        },
        {"guard": 'put the training in a function called under if __name__ == "__main__":'},
        fact=WORKERS,
    ),
    Rule(
        "workers-pickle",
        WORKERS_SPAWNED,
        "a lambda or a local function given to a DataLoader with workers",
        ("DataLoader",),
        ("DataLoader", "lambda"),
        {
            "callable": "{part} is {what}: DataLoader {started}, which pickles it, " + _PICKLE,
            "dataset": "the dataset keeps {what}: DataLoader {started}, which pickles the dataset, "
            + _PICKLE,
        },
        {"callable": "define {part} {home}", "dataset": "define the transform {home}"},
        fact=WORKERS,
    ),
    Rule(
        "nccl-cpu",
        SEVERAL_CPU,
        'init_process_group("nccl")',
        ("init_process_group",),
        ("init_process_group",),
        {
            "nccl": 'init_process_group("nccl") needs NVIDIA GPUs, and this plan runs {processes} '
            '{device} processes: it fails ("{error}")'
        },
        {
            "plain": 'write init_process_group("nccl" if device.type == "cuda" else "gloo")',
            "accelerate": "let Accelerator() make the process group",
        },
    ),
    Rule(
        "cuda-amp",
        NO_CUDA,
        "torch.cuda.amp and autocast or GradScaler for cuda",
        ("autocast", "GradScaler"),
        ("autocast", "GradScaler"),
        {
            "autocast": "{spelled} only changes cuda operations: on this {device} plan nothing runs in "
            'lower precision (without CUDA torch warns "Disabling autocast")',
            "scaler": {
                "mps": '{spelled} scales cuda gradients only: on mps torch disables it ("CUDA is '
                'not available. Disabling"), so fp16 gradients go unscaled',
                "cpu": "{spelled} scales cuda gradients only: the plan is cpu, where fp16 does "
                "not run and bf16 needs no scaling (without CUDA torch disables it)",
            },
        },
        {
            "autocast": {
                "mps": "write torch.autocast(device.type, dtype=...) (fp16 autocast on mps "
                "needs torch 2.5)",
                "cpu": "write torch.autocast(device.type, dtype=...)",
            },
            "autocast-accelerate": {
                "mps": "let Accelerator(mixed_precision=...) or --mixed_precision "
                "choose it (fp16 autocast on mps needs torch 2.5)",
                "cpu": "let Accelerator(mixed_precision=...) or --mixed_precision choose it",
            },
            "scaler": {
                "mps": "write torch.amp.GradScaler(device.type) (mps has one from torch 2.8)",
                "cpu": "drop it on cpu, or write torch.amp.GradScaler(device.type)",
            },
        },
        breaks=False,
        fact=PRECISION,
    ),
    Rule(
        "pin-memory-mps",
        MPS,
        "pin_memory=True, also in a dict of DataLoader arguments",
        ("DataLoader",),
        ("DataLoader", "pin_memory"),
        {
            "pin": "pin_memory=True does nothing on mps: torch warns \"'pin_memory' argument is set as "
            'true but not supported on MPS now" and pins nothing'
        },
        {"pin": 'write pin_memory=(device.type == "cuda")'},
        breaks=False,
        fact=WORKERS,
    ),
)
BY_NAME = {rule.name: rule for rule in RULES}


# ---------------------------------------------------------------- the code behind each rule


class Check:
    """What one rule does in one check: handed the calls (and branches) its declaration asks
    for; `finish` once the walk is over. A plain function registered with `implements` is the
    `call` of a Check (its `function`)."""

    function = None  # (rules, call, where, name, qualified)

    def __init__(self, rules, rule: Rule):
        self.rules, self.rule = rules, rule
        if self.function is not None:  # called as it is, with no method in between
            self.call = partial(self.function, rules)

    def call(self, call, where, name: str | None, qualified: str | None) -> None:
        pass

    def branch(self, node, where) -> None:
        pass

    def finish(self) -> None:
        pass


IMPLEMENTATIONS: dict[str, type[Check]] = {}


def implements(name: str) -> Callable:
    """Registers the code behind the rule `name`: a Check class, or a function
    (rules, call, where, name, qualified) that is its `call`."""

    def register(code):
        if name not in BY_NAME or name in IMPLEMENTATIONS:
            raise ValueError(f"{name}: not a declared rule, or implemented twice")
        if isinstance(code, type):
            IMPLEMENTATIONS[name] = code
        else:
            IMPLEMENTATIONS[name] = type(
                f"Check_{name}", (Check,), {"function": staticmethod(code)}
            )
        return code

    return register
