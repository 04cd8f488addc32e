"""`mpslaunch.launch(...)`: the launch command from Python or a notebook, with the same plan.

The keyword options are launch's flags under their Python names (num_processes=2, cpu=True,
mixed_precision="bf16", gpu_ids="0,1", ...), plus profile= and config_file=. A script runs
exactly as `mpslaunch launch` runs it and its exit code comes back. A function runs in this
process with the plan's environment applied for the call (one process: its return value comes
back), or in several processes through torch's elastic_launch (a dict of each rank's return
value, by rank). Those start with fork, as Accelerate's notebook_launcher does, so a function
defined in a notebook works; start_method="spawn" starts fresh interpreters instead (the function
must then be importable from a .py file).

A launch reads and sets this process's environment, so calls from several threads run one at a
time: each gets its own plan and its own end line, and the caller's os.environ is left as it was.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading

from mpslaunch import output
from mpslaunch.launcher.prepare import announce, prepare
from mpslaunch.output import MpslaunchError
from mpslaunch.plan import LaunchPlan
from mpslaunch.run import execute, thread_problem
from mpslaunch.settings import API, REQUEST_OPTIONS, LaunchRequest

OPTIONS = tuple(option.name for option in REQUEST_OPTIONS)
_ONE_AT_A_TIME = threading.RLock()  # reentrant: a function run here may launch again


def launch(
    target,
    *args,
    profile: str | None = None,
    config_file: str | None = None,
    quiet: bool = False,
    start_method: str = "fork",
    **options,
):
    """Run a script (a path) or a function with the plan `mpslaunch launch` would make here."""
    _check_options(options)
    _check_call(target, args, profile, config_file, start_method)
    with _ONE_AT_A_TIME:
        return _launch(target, args, profile, config_file, quiet, start_method, options)


def _launch(
    target,
    args: tuple,
    profile: str | None,
    config_file: str | None,
    quiet: bool,
    start_method: str,
    options: dict,
):
    function = target if callable(target) else None
    name = getattr(function, "__qualname__", "function") if function else os.fspath(target)
    request = LaunchRequest(name, () if function else tuple(map(str, args)), **options)
    plan = prepare(
        request, profile, config_file, quiet, target_is_file=function is None, asked_in=API
    )
    problem = None if function else thread_problem(plan)
    if problem:  # before the plan line: nothing is started
        raise MpslaunchError(problem)
    announce(plan, quiet)
    if function is None:
        return execute(plan, report=not quiet)
    if plan.engine == "single":
        return _call_here(plan, function, args)
    return _run_in_processes(plan, function, args, start_method)


def _check_options(options: dict) -> None:
    for name in options:
        if name not in OPTIONS:
            import difflib  # only on a mistake

            close = difflib.get_close_matches(name, OPTIONS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise MpslaunchError(
                f"mpslaunch.launch() has no option {name!r}{hint}; it takes "
                "launch's options under their Python names, profile= and config_file="
            )


def _check_call(target, args: tuple, profile, config_file, start_method) -> None:
    """What Python would refuse later with a bare TypeError or ValueError (or not at all), in
    launch's words, before anything is planned or printed."""
    if not callable(target):
        path = os.fspath(target) if isinstance(target, (str, os.PathLike)) else target
        if not isinstance(path, str):
            raise MpslaunchError(
                "mpslaunch.launch() runs a script (its path, as text) or a "
                f"function, not {_described(path)}"
                + ("; decode it with os.fsdecode()" if isinstance(path, bytes) else "")
            )
        for where, text in [
            ("the script's path", path),
            *((f"argument {number}", str(arg)) for number, arg in enumerate(args, 1)),
        ]:
            if "\0" in text:
                raise MpslaunchError(
                    f"{where} holds a NUL character, which no command line can carry: {text[:80]!r}"
                )
    for name, value in (("profile", profile), ("config_file", config_file)):
        if value is not None and not isinstance(
            value, str if name == "profile" else (str, os.PathLike)
        ):
            raise MpslaunchError(f"{name}= must be text, not {_described(value)}")
    if start_method not in ("fork", "spawn", "forkserver"):
        raise MpslaunchError(
            f"start_method must be fork, spawn or forkserver, not {start_method!r}"
        )


def _described(value) -> str:
    """A wrong value's type, and the value when it is short to show."""
    if value is None:
        return "None"
    shown = f" {value!r}" if isinstance(value, (bytes, int, float)) else ""
    return type(value).__name__ + shown[:81]


def _call_here(plan: LaunchPlan, function, args: tuple):
    from mpslaunch.run import environment

    if "torch" in sys.modules and "PYTORCH_ENABLE_MPS_FALLBACK" in plan.env:
        output.warning(
            "torch is already imported, and it reads PYTORCH_ENABLE_MPS_FALLBACK when "
            "it loads; set it before importing torch"
        )
    with environment(plan.env):
        return FreshCall(function)(*args)


def _run_in_processes(plan: LaunchPlan, function, args: tuple, start_method: str) -> dict:
    if start_method != "fork":
        _check_spawnable(function, args)
    from mpslaunch.run import run_function

    return run_function(plan, FreshCall(function), args, start_method)


class FreshCall:
    """The user's function, called with Accelerate's process-wide state cleared first: an
    Accelerator made by an earlier call (or inherited through fork) would otherwise keep that
    call's settings. It carries the function's own name, by which torch names a failing rank."""

    def __init__(self, function):
        self.function = function
        self.__name__ = getattr(function, "__name__", type(function).__name__)
        self.__qualname__ = getattr(function, "__qualname__", self.__name__)

    def __call__(self, *args):
        if "accelerate.state" in sys.modules:
            from accelerate.state import AcceleratorState, GradientState

            AcceleratorState._reset_state(reset_partial_state=True)
            GradientState._reset_state()
        return self.function(*args)


def _check_spawnable(function, args: tuple) -> None:
    """spawn starts fresh interpreters: they import the function by name and unpickle the args."""
    main = sys.modules.get("__main__")
    if function.__module__ == "__main__" and not getattr(main, "__file__", None):
        raise MpslaunchError(
            f"{function.__qualname__} is defined in a notebook or an interactive "
            "session, which processes started with spawn cannot import; move it "
            "to a .py file and import it, or use start_method='fork'"
        )
    try:
        pickle.dumps((function, args))
    except Exception as error:  # pickle raises many types
        raise MpslaunchError(
            f"{getattr(function, '__qualname__', function)} or its arguments "
            f"cannot be sent to the processes ({type(error).__name__}: {error}); "
            "define the function at the top level of a module"
        ) from None
