"""The rules: what a call does on the target's plan, when that breaks the run or defeats it.

A rule speaks only when it is sure: about literals (and names bound once to one), about what
values.py can tell of an expression on the plan, never about what a variable might hold at
run time, never in a branch a device test rules out or under one whose answer is unknown
(walk.py), and never inside a try that catches the error. Each mps rule cites its fact in
docs/mps-facts.md. The DataLoader rules are in loaders.py; the devices a script chooses for
itself (the CPU fall-back, cuda as a default) in fallback.py.
"""

from __future__ import annotations

import ast
import re

from mpslaunch.check import fallback, loaders
from mpslaunch.check.report import Finding
from mpslaunch.check.scan import Project, Where
from mpslaunch.check.target import Target
from mpslaunch.check.values import CUDA_TENSOR, Prefix, Values, is_cuda_text

SCRIPTS_FOR_CUDA = "Scripts written for CUDA"  # docs/mps-facts.md sections
PRECISION = "Precision"

CUDA_AUTOCAST = {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
CUDA_SCALER = {"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"}
AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"}
SCALER = {"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler"}
FLOAT64 = {"torch.float64", "torch.double"}
DATALOADER = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
# torch.cuda functions that need a CUDA device (torch.cuda.manual_seed and the like do not).
CUDA_CALLS = {"torch.cuda.set_device", "torch.cuda.synchronize", "torch.cuda.current_device",
              "torch.cuda.get_device_name", "torch.cuda.get_device_properties"}
# Methods whose device= places a tensor or a module.
TENSOR_METHODS = ("to", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "to_empty")
_LETTER = re.compile(r"[A-Za-z]")

MPS_FLOAT64_ERROR = "Cannot convert a MPS Tensor to float64 dtype"


class Rules:
    """Called for each call that can run, and each branch; collects the findings for one target."""

    def __init__(self, target: Target, project: Project):
        self.target, self.project = target, project
        self.values = Values(target, project)
        self.choices = fallback.Choices(self)
        self._found: list[Finding] = []
        self.device_fix = ("accelerator.device" if project.uses_accelerate else
                           'torch.device(os.environ["MPSLAUNCH_DEVICE"])')

    @property
    def findings(self) -> list[Finding]:
        self.choices.findings()
        return self._found

    def call(self, call: ast.Call, where: Where) -> None:
        name = called_name(call)
        qualified = where.facts.qualified(call.func)
        self.choices.arguments_of(call, qualified)
        if self.target.device != "cuda":
            self.hard_coded_cuda(call, name, qualified, where)
            self.load(call, qualified, where)
            self.cuda_amp(call, qualified, where)
            self.nccl(call, qualified, where)
            if name == "add_argument":
                fallback.option_default(self, call, where)
        if self.target.device == "mps":
            self.float64(call, name, qualified, where)
        if qualified in DATALOADER:
            loaders.dataloader(self, call, where)

    def branch(self, node: ast.AST, where: Where) -> None:
        self.choices.branch(node, where)

    def add(self, where: Where, call: ast.AST, rule: str, message: str, fix: str,
            breaks: bool = True, fact: str | None = None) -> None:
        self._found.append(Finding(where.facts.source.shown, call.lineno, rule, message, fix,
                                   breaks, fact))

    # ------------------------------------------------------------ cuda written into the script

    def hard_coded_cuda(self, call: ast.Call, name: str | None, qualified: str | None,
                        where: Where) -> None:
        if where.device_unknown or where.catches(("RuntimeError", "AssertionError")):
            return
        what = None
        if name == "cuda" and isinstance(call.func, ast.Attribute) and qualified is None:
            what = ".cuda()"
        elif qualified in CUDA_CALLS or CUDA_TENSOR.match(qualified or ""):
            what = f"{qualified}()"
        elif qualified in ("torch.device", "torch.set_default_device") or (
                name == "to" and isinstance(call.func, ast.Attribute) and qualified is None):
            shown = {"torch.device": "torch.device", "torch.set_default_device":
                     "torch.set_default_device"}.get(qualified, ".to")
            what = self.cuda_argument(call.args[0] if call.args else None, shown, where)
        if what is None and takes_a_device(call, name, qualified):
            for keyword in call.keywords:
                if keyword.arg == "device":
                    what = self.cuda_argument(keyword.value, "device=", where)
        if what is None:
            return
        if self.target.device == "mps":
            message = f'{what} fails on a Mac, where torch has no CUDA ("Torch not compiled with CUDA enabled")'
        else:
            message = (f"{what} puts work on cuda, but the plan is cpu: without an NVIDIA GPU it "
                       'fails ("Found no NVIDIA driver"), with one it runs outside the plan')
        fix = (f"write .to(device) with device = {self.device_fix}" if what == ".cuda()"
               else f"use {self.device_fix}")
        self.add(where, call, "cuda-device", message, fix, fact=SCRIPTS_FOR_CUDA)

    def cuda_argument(self, node: ast.expr | None, shown: str, where: Where) -> str | None:
        """`.to("cuda:0")` (or `.to(device)` with the line that binds device to "cuda") when
        node is a cuda device; None otherwise."""
        text = self.cuda_text(node, where)
        if text is None:
            return None
        what = f"{shown}{text}" if shown.endswith("=") else f"{shown}({text})"
        return f"{what}, cuda unless an option says otherwise," if isinstance(node, ast.IfExp) else what

    def cuda_text(self, node: ast.expr | None, where: Where) -> str | None:
        """How to show node when it names a cuda device: a literal, f"cuda:{rank}", a name
        bound once to one, or `"cuda" if test else "cpu"` where the test holds on the plan. A
        module-level default that exec() may rebind is reported once at its line instead."""
        if isinstance(node, ast.Name) and fallback.module_default(self, node, where):
            return None
        known = where.literal(node)
        if known is not None:
            value, line = known
            if not is_cuda_text(value):
                return None
            return f'"{value}"' if line is None else f'{node.id} (= "{value}", line {line})'
        if isinstance(node, ast.Name):
            if node.id not in where.facts.cuda_names:
                return None
            bound, _ = where.scope.lookup(node.id)
            if not isinstance(bound, (ast.JoinedStr, ast.Call)) or bound.lineno == node.lineno:
                return None
            value = where.value(node)
            return f'{node.id} (= {ast.unparse(bound)}, line {bound.lineno})' \
                if isinstance(value, Prefix) and value.startswith("cuda") else None
        value = where.value(node) if isinstance(node, (ast.IfExp, ast.JoinedStr, ast.Call)) else None
        if isinstance(value, Prefix) and value.startswith("cuda"):
            return f'f"{value}..."'
        if isinstance(node, ast.IfExp) and is_cuda_text(value):
            return ast.unparse(node)
        return None

    # ------------------------------------------------------------ checkpoints

    def load(self, call: ast.Call, qualified: str | None, where: Where) -> None:
        if qualified != "torch.load" or where.device_unknown or where.catches(("RuntimeError",)):
            return
        on = "on a Mac" if self.target.device == "mps" else "without an NVIDIA GPU"
        location = call.args[1] if len(call.args) > 1 else keyword_value(call, "map_location")
        if location is not None:
            text = self.cuda_text(location, where)
            if text is not None:
                self.add(where, call, "load-map-location",
                         f"torch.load with map_location={text} puts the checkpoint on cuda, which "
                         f'fails {on} ("Attempting to deserialize object on a CUDA device")',
                         'write map_location="cpu" (then move the model to the device)',
                         fact=SCRIPTS_FOR_CUDA)
            return
        if any(keyword.arg is None for keyword in call.keywords) or self.loads_own_file(call, where):
            return
        self.add(where, call, "load-map-location",
                 f"torch.load without map_location: a checkpoint saved from cuda tensors fails to "
                 f'load {on} ("Attempting to deserialize object on a CUDA device")',
                 'write map_location="cpu" (then move the model to the device)', fact=SCRIPTS_FOR_CUDA)

    def loads_own_file(self, call: ast.Call, where: Where) -> bool:
        """Whether torch.load reads a file the script writes itself with torch.save (the same
        path expression, or the same file name in it): saved here, it loads here."""
        path = call.args[0] if call.args else keyword_value(call, "f")
        if path is None:
            return False
        loaded = _path_forms(path, where.scope.lookup)
        for facts in self.project.facts:
            for saved in facts.saved_paths:
                if loaded & _path_forms(saved, facts.binding):
                    return True
        return False

    # ------------------------------------------------------------ mixed precision

    def cuda_amp(self, call: ast.Call, qualified: str | None, where: Where) -> None:
        if qualified is None or where.device_unknown:
            return
        enabled = keyword_value(call, "enabled")
        if enabled is not None and where.value(enabled) is not True:
            return  # off on this plan, or only sometimes
        device = self.target.device
        if qualified in CUDA_AUTOCAST or (qualified in AUTOCAST and
                                          self.literal_is(call, 0, "device_type", where, "cuda")):
            spelled = "torch.cuda.amp.autocast" if qualified in CUDA_AUTOCAST else 'autocast("cuda")'
            fix = ("let Accelerator(mixed_precision=...) or --mixed_precision choose it"
                   if self.device_fix == "accelerator.device" else
                   "write torch.autocast(device.type, dtype=...)")
            if device == "mps":
                fix += " (fp16 autocast on mps needs torch 2.5)"
            self.add(where, call, "cuda-amp",
                     f"{spelled} only changes cuda operations: on this {device} plan nothing runs "
                     "in lower precision (without CUDA torch warns \"Disabling autocast\")",
                     fix, breaks=False, fact=PRECISION)
        elif qualified in CUDA_SCALER or (qualified in SCALER and (
                not call.args and keyword_value(call, "device") is None
                or self.literal_is(call, 0, "device", where, "cuda"))):
            spelled = "torch.cuda.amp.GradScaler" if qualified in CUDA_SCALER else "GradScaler for cuda"
            if device == "mps":
                message = (f"{spelled} scales cuda gradients only: on mps torch disables it "
                           "(\"CUDA is not available. Disabling\"), so fp16 gradients go unscaled")
                fix = "write torch.amp.GradScaler(device.type) (mps has one from torch 2.8)"
            else:
                message = (f"{spelled} scales cuda gradients only: the plan is cpu, where fp16 "
                           "does not run and bf16 needs no scaling (without CUDA torch disables it)")
                fix = "drop it on cpu, or write torch.amp.GradScaler(device.type)"
            self.add(where, call, "cuda-amp", message, fix, breaks=False, fact=PRECISION)

    def literal_is(self, call: ast.Call, position: int, keyword: str, where: Where, wanted: str) -> bool:
        node = call.args[position] if len(call.args) > position else keyword_value(call, keyword)
        known = where.literal(node)
        return known is not None and known[0] == wanted

    # ------------------------------------------------------------ several processes

    def nccl(self, call: ast.Call, qualified: str | None, where: Where) -> None:
        if self.target.processes < 2 or not (qualified or "").endswith("init_process_group") \
                or not (qualified or "").startswith("torch.distributed"):
            return
        if not self.literal_is(call, 0, "backend", where, "nccl") or where.device_unknown:
            return
        error = ("Distributed package doesn't have NCCL built in" if self.target.system == "Darwin"
                 else "ProcessGroupNCCL is only supported with GPUs, no GPUs found!")
        fix = ("let Accelerator() make the process group" if self.device_fix == "accelerator.device"
               else 'write init_process_group("nccl" if device.type == "cuda" else "gloo")')
        self.add(where, call, "nccl-cpu",
                 f'init_process_group("nccl") needs NVIDIA GPUs, and this plan runs '
                 f'{self.target.processes} {self.target.device} processes: it fails ("{error}")',
                 fix, fact=SCRIPTS_FOR_CUDA)

    # ------------------------------------------------------------ float64 on mps

    def float64(self, call: ast.Call, name: str | None, qualified: str | None, where: Where) -> None:
        if where.device_unknown:
            return
        facts = where.facts
        if qualified == "torch.set_default_dtype" and call.args and facts.qualified(call.args[0]) in FLOAT64 \
                or qualified == "torch.set_default_tensor_type" and call.args \
                and "DoubleTensor" in (facts.qualified(call.args[0]) or str(getattr(call.args[0], "value", ""))):
            self.add(where, call, "float64-mps",
                     "float64 as the default dtype: every new float tensor is float64, which mps "
                     f'does not have, so moving them to mps fails ("{MPS_FLOAT64_ERROR}")',
                     "drop it (float32 is the default), or keep float64 work on the CPU", fact=PRECISION)
            return
        if name not in ("double", "to", "type") and not any(k.arg == "dtype" for k in call.keywords):
            return
        chain = method_chain(call)
        if any(self.makes_float64(link, facts) for link in chain) and \
                any(self.moves_to_device(link, where) for link in chain):
            self.add(where, call, "float64-mps",
                     f'float64 on mps: torch raises "{MPS_FLOAT64_ERROR}"',
                     "use float32 (.float(), dtype=torch.float32), and float64 only on the CPU "
                     "(.cpu().double())", fact=PRECISION)

    def makes_float64(self, call: ast.Call, facts) -> bool:
        if called_name(call) == "double" and not call.args and facts.qualified(call.func) is None:
            return True
        dtypes = [keyword_value(call, "dtype")]
        if called_name(call) in ("to", "type"):
            dtypes += call.args[:2]
        return any(facts.qualified(node) in FLOAT64 for node in dtypes if node is not None)

    def moves_to_device(self, call: ast.Call, where: Where) -> bool:
        """A device that is not the CPU: "mps", or a name or attribute called device."""
        candidates = [keyword_value(call, "device")]
        if called_name(call) == "to" and where.facts.qualified(call.func) is None:
            candidates += call.args[:1]
        return any(is_device_expression(node, where) for node in candidates if node is not None)

# ---------------------------------------------------------------- helpers


def called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def keyword_value(call: ast.Call, name: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


def takes_a_device(call: ast.Call, name: str | None, qualified: str | None) -> bool:
    """Whether `device=` of this call places tensors or a model: torch's own functions and
    classes, a tensor's or module's methods, a Hugging Face pipeline (not `dict(device=...)`)."""
    if qualified is None:
        return isinstance(call.func, ast.Attribute) and name in TENSOR_METHODS
    return (qualified.startswith(("torch.", "torchvision.", "transformers."))
            and qualified not in (*CUDA_SCALER, *SCALER, *CUDA_AUTOCAST, *AUTOCAST))


def is_device_expression(node: ast.expr, where: Where) -> bool:
    """A device that is not the CPU on the plan: "mps", or a name or attribute called device
    (unless the plan makes it the CPU: a device chosen as `"cuda" if ... else "cpu"`)."""
    known = where.literal(node)
    if known is not None:
        return known[0] == "mps"
    value = where.value(node)
    if isinstance(value, str):
        return value.split(":")[0] != "cpu"
    if isinstance(node, ast.Name):
        return "device" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "device" in node.attr.lower()
    if isinstance(node, ast.Call) and where.facts.qualified(node.func) == "torch.device":
        first = where.literal(node.args[0]) if node.args else None
        return first is None or first[0] != "cpu"
    return False


def method_chain(call: ast.Call) -> list[ast.Call]:
    """`x.to(d).double()` -> both calls: the call and the calls its receiver is made of."""
    chain = [call]
    node = call.func
    while isinstance(node, ast.Attribute):
        node = node.value
        if isinstance(node, ast.Call):
            chain.append(node)
            node = node.func
    return chain


def _path_forms(path: ast.expr, lookup) -> set[str]:
    """What identifies the file a path expression names: its text, the text of what a name
    stands for (`with open(p) as f`: p), and the file names written in it."""
    forms = {ast.dump(path)}
    if isinstance(path, ast.Name):
        bound, _ = lookup(path.id)
        if isinstance(bound, ast.Call) and getattr(bound.func, "id", None) == "open" and bound.args:
            bound = bound.args[0]
        if isinstance(bound, ast.expr):
            path = bound
            forms.add(ast.dump(path))
    forms.update(node.value for node in ast.walk(path)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str) and _file_name(node.value))
    return forms


def _file_name(text: str) -> bool:
    """"ckpt.pt", "saved/%s_%d.pth": enough of a name to tell one file from another (not ".pt")."""
    if text.startswith(".") and "/" not in text:
        return False
    return len(text.strip("./")) >= 4 and _LETTER.search(text) is not None
