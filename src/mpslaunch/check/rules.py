"""The rules: what a call does on the target's plan, when that breaks the run or defeats it.

A rule speaks only when it is sure: about literals (and names bound once to one), never about
what a variable might hold at run time, and never under a condition that names the device
(`if torch.cuda.is_available():`) or inside a try that catches the error. Each mps rule cites
its fact in docs/mps-facts.md.
"""

from __future__ import annotations

import ast

from mpslaunch.check.report import Finding
from mpslaunch.check.scan import FUNCTION_NODES, Project, Where, has_main_guard
from mpslaunch.check.target import Target

SCRIPTS_FOR_CUDA = "Scripts written for CUDA"  # docs/mps-facts.md sections
PRECISION = "Precision"
WORKERS = "DataLoader workers"

# Words in a condition that show the script already chooses by device or precision.
DEVICE_WORDS = ("cuda", "gpu", "mps", "device", "accelerat", "nvidia")
AMP_WORDS = (*DEVICE_WORDS, "amp", "fp16", "half", "precision", "scaler", "autocast")
FLOAT64_WORDS = ("mps", "device", "float64", "double", "dtype", "cpu", "precision")
LOAD_WORDS = (*DEVICE_WORDS, "map_location", "cpu")
NCCL_WORDS = ("cuda", "gpu", "nccl", "backend", "device")
PIN_WORDS = (*DEVICE_WORDS, "pin")

CUDA_AUTOCAST = {"torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
CUDA_SCALER = {"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"}
AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"}
SCALER = {"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler"}
FLOAT64 = {"torch.float64", "torch.double"}
DATALOADER = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
# Methods whose device= places a tensor or a module.
TENSOR_METHODS = ("to", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "to_empty")
# DataLoader's positional parameters, in order.
LOADER_PARAMETERS = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler",
                     "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout",
                     "worker_init_fn", "multiprocessing_context")
# Calls that keep the transforms they are given (so a lambda inside is pickled with the dataset).
TRANSFORM_HOLDERS = {"Compose", "Lambda", "RandomApply", "RandomChoice", "RandomOrder",
                     "partial", "Sequential"}

BOOTSTRAP_ERROR = ("An attempt has been made to start a new process before the current "
                   "process has finished its bootstrapping phase")
MPS_FLOAT64_ERROR = "Cannot convert a MPS Tensor to float64 dtype"


class Rules:
    """Called for each call that can run; collects the findings for one target."""

    def __init__(self, target: Target, project: Project):
        self.target = target
        self.findings: list[Finding] = []
        self.device_fix = ("accelerator.device" if project.uses_accelerate else
                           'torch.device(os.environ["MPSLAUNCH_DEVICE"])')

    def __call__(self, call: ast.Call, where: Where) -> None:
        name = called_name(call)
        qualified = where.facts.qualified(call.func)
        if self.target.device != "cuda":
            self.hard_coded_cuda(call, name, qualified, where)
            self.load_without_map_location(call, qualified, where)
            self.cuda_amp(call, qualified, where)
            self.nccl(call, qualified, where)
        if self.target.device == "mps":
            self.float64(call, name, qualified, where)
        if qualified in DATALOADER:
            self.dataloader(call, where)

    def add(self, where: Where, call: ast.AST, rule: str, message: str, fix: str,
            breaks: bool = True, fact: str | None = None) -> None:
        self.findings.append(Finding(where.facts.source.shown, call.lineno, rule, message, fix,
                                     breaks, fact))

    # ------------------------------------------------------------ cuda written into the script

    def hard_coded_cuda(self, call: ast.Call, name: str | None, qualified: str | None,
                        where: Where) -> None:
        if where.guarded_by(DEVICE_WORDS) or where.catches(("RuntimeError", "AssertionError")):
            return
        what = None
        if name == "cuda" and isinstance(call.func, ast.Attribute) and qualified is None:
            what = ".cuda()"
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
        node is a cuda device literal; None otherwise."""
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                and str(node.values[0].value).startswith("cuda"):
            text = f'f"{node.values[0].value}..."'
        else:
            known = where.literal(node)
            if known is None or not isinstance(known[0], str) or not is_cuda(known[0]):
                return None
            value, line = known
            text = f'"{value}"' if line is None else f'{node.id} (= "{value}", line {line})'
        return f"{shown}{text}" if shown.endswith("=") else f"{shown}({text})"

    # ------------------------------------------------------------ checkpoints

    def load_without_map_location(self, call: ast.Call, qualified: str | None, where: Where) -> None:
        if qualified != "torch.load" or len(call.args) > 1:
            return
        if any(keyword.arg in ("map_location", None) for keyword in call.keywords):
            return
        if where.guarded_by(LOAD_WORDS) or where.catches(("RuntimeError",)):
            return
        on = "on a Mac" if self.target.device == "mps" else "without an NVIDIA GPU"
        self.add(where, call, "load-map-location",
                 f"torch.load without map_location: a checkpoint saved from cuda tensors fails to "
                 f'load {on} ("Attempting to deserialize object on a CUDA device")',
                 'write map_location="cpu" (then move the model to the device)', fact=SCRIPTS_FOR_CUDA)

    # ------------------------------------------------------------ mixed precision

    def cuda_amp(self, call: ast.Call, qualified: str | None, where: Where) -> None:
        if qualified is None or where.guarded_by(AMP_WORDS):
            return
        enabled = keyword_value(call, "enabled")
        if enabled is not None and where.literal(enabled) != (True, None):
            return  # enabled by a variable: only sometimes
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
        if not self.literal_is(call, 0, "backend", where, "nccl") or where.guarded_by(NCCL_WORDS):
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
        if where.guarded_by(FLOAT64_WORDS):
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

    # ------------------------------------------------------------ DataLoader

    def dataloader(self, call: ast.Call, where: Where) -> None:
        if self.target.device == "mps" and not where.guarded_by(PIN_WORDS) and \
                where.literal(loader_argument(call, "pin_memory")) == (True, None):
            self.add(where, call, "pin-memory-mps",
                     "pin_memory=True does nothing on mps: torch warns \"'pin_memory' argument is "
                     "set as true but not supported on MPS now\" and pins nothing",
                     'write pin_memory=(device.type == "cuda")', breaks=False, fact=WORKERS)
        workers = self.workers(call, where)
        method = self.start_method(call, where)
        if workers is None or method == "fork":
            return
        started = f"workers ({workers}) start by {method} {self.target.where}"
        if where.facts.source.is_script and where.at_import and not has_main_guard(where.facts.source.tree):
            self.add(where, call, "workers-main-guard",
                     f"DataLoader in a script without a main guard: its {started}, each "
                     f'runs this script again, and the run stops ("{BOOTSTRAP_ERROR}")',
                     'put the training in a function called under if __name__ == "__main__":',
                     fact=WORKERS)
        for part, node in (("collate_fn", loader_argument(call, "collate_fn")),
                           ("worker_init_fn", loader_argument(call, "worker_init_fn"))):
            what = unpicklable(node, where)
            if what:
                self.add(where, call, "workers-pickle",
                         f"{part} is {what}: DataLoader {started}, which pickles it, and the run "
                         f"stops (\"Can't pickle ...\")",
                         f"define {part} with def at module level", fact=WORKERS)
        what = dataset_unpicklable(loader_argument(call, "dataset"), where)
        if what:
            self.add(where, call, "workers-pickle",
                     f"the dataset keeps {what}: DataLoader {started}, which pickles the dataset, "
                     "and the run stops (\"Can't pickle ...\")",
                     "define the transform with def at module level", fact=WORKERS)

    def workers(self, call: ast.Call, where: Where) -> str | None:
        """'num_workers=4' (or the expression: workers unless it is 0 at run time) when the
        loader starts workers; None when it does not, or cannot be told (a **kwargs)."""
        node = loader_argument(call, "num_workers")
        if node is None:
            return None
        known = where.literal(node)
        if known is not None:
            value = known[0]
            return f"num_workers={value}" if isinstance(value, int) and value > 0 else None
        return f"num_workers={ast.unparse(node)}"

    def start_method(self, call: ast.Call, where: Where) -> str:
        context = loader_argument(call, "multiprocessing_context")
        if context is not None:
            if isinstance(context, ast.Call) and called_name(context) == "get_context" and context.args:
                context = context.args[0]
            known = where.literal(context)
            return str(known[0]) if known else "fork"  # an unknown context: say nothing
        return where.facts.start_method or self.target.start_method


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


def loader_argument(call: ast.Call, name: str) -> ast.expr | None:
    """A DataLoader argument given by keyword or by position (not through *args)."""
    value = keyword_value(call, name)
    if value is not None:
        return value
    position = LOADER_PARAMETERS.index(name)
    if any(isinstance(arg, ast.Starred) for arg in call.args[:position + 1]):
        return None
    return call.args[position] if len(call.args) > position else None


def takes_a_device(call: ast.Call, name: str | None, qualified: str | None) -> bool:
    """Whether `device=` of this call places tensors or a model: torch's own functions and
    classes, a tensor's or module's methods, a Hugging Face pipeline (not `dict(device=...)`)."""
    if qualified is None:
        return isinstance(call.func, ast.Attribute) and name in TENSOR_METHODS
    return (qualified.startswith(("torch.", "torchvision.", "transformers."))
            and qualified not in (*CUDA_SCALER, *SCALER, *CUDA_AUTOCAST, *AUTOCAST))


def is_cuda(text: str) -> bool:
    return text == "cuda" or text.startswith("cuda:")


def is_device_expression(node: ast.expr, where: Where) -> bool:
    known = where.literal(node)
    if known is not None:
        return known[0] == "mps"
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


def unpicklable(node: ast.expr | None, where: Where) -> str | None:
    """What makes a callable unpicklable by name: a lambda, or a def inside a function."""
    if isinstance(node, ast.Lambda):
        return "a lambda"
    if isinstance(node, ast.Call) and called_name(node) == "partial" and node.args:
        return unpicklable(node.args[0], where)
    if isinstance(node, ast.Name):
        value, scope = where.scope.lookup(node.id)
        if isinstance(value, ast.Lambda):
            return f"{node.id}, a lambda (line {value.lineno})"
        if isinstance(value, FUNCTION_NODES) and scope is not None and scope.function is not None:
            return f"{node.id}, a function defined inside {scope.name}() (line {value.lineno})"
    return None


def dataset_unpicklable(node: ast.expr | None, where: Where) -> str | None:
    """A lambda or local function among the transforms the dataset is built with, or one its
    class stores on self."""
    if isinstance(node, ast.Name):
        node, _ = where.scope.lookup(node.id)
    if not isinstance(node, ast.Call):
        return None
    for keyword in node.keywords:
        if keyword.arg and "transform" in keyword.arg:
            found = _in_transforms(keyword.value, where)
            if found:
                return f"{found} in {keyword.arg}"
    for argument in node.args:
        if isinstance(argument, ast.Call) and called_name(argument) in TRANSFORM_HOLDERS:
            found = _in_transforms(argument, where)
            if found:
                return found
    if isinstance(node.func, ast.Name):
        cls, _ = where.scope.lookup(node.func.id)
        if isinstance(cls, ast.ClassDef):
            return _stored_lambda(cls)
    return None


def _in_transforms(node: ast.expr, where: Where, depth: int = 0) -> str | None:
    found = unpicklable(node, where)
    if found or depth > 8:
        return found
    if isinstance(node, ast.Name):  # a transform built on an earlier line
        value, _ = where.scope.lookup(node.id)
        return _in_transforms(value, where, depth + 1) if isinstance(value, ast.expr) else None
    if isinstance(node, (ast.List, ast.Tuple)):
        children = node.elts
    elif isinstance(node, ast.Call) and called_name(node) in TRANSFORM_HOLDERS:
        children = [*node.args, *(keyword.value for keyword in node.keywords)]
    else:
        return None
    for child in children:
        found = _in_transforms(child, where, depth + 1)
        if found:
            return found
    return None


def _stored_lambda(cls: ast.ClassDef) -> str | None:
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id == "self":
                    return f"a lambda as self.{target.attr} (line {node.lineno})"
    return None
