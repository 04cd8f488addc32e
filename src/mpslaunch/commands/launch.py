"""`mpslaunch launch`: the flags become a LaunchRequest; launcher.prepare makes the plan, which
is printed (--dry_run) or run (launcher.execute).
"""

from __future__ import annotations

from types import SimpleNamespace

from mpslaunch import launcher, output
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import (
    ACCELERATOR,
    MACHINES,
    OPTIONS,
    OUTPUT,
    PLAN,
    add_table_options,
    request_from_args,
)

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on every launch
if TYPE_CHECKING:
    import argparse

    Arguments = argparse.Namespace | SimpleNamespace

HELP = """\
Run a training script on the device this machine should use: mps on Apple silicon,
cuda on NVIDIA GPUs, cpu otherwise, unless the profile or an option says otherwise.
The script learns the plan from environment variables, so a script written for
Hugging Face Accelerate (Accelerator()) follows it unchanged and a plain PyTorch
script reads MPSLAUNCH_DEVICE. Several processes (cpu or cuda) and several machines
run through torch.distributed.run. Everything after the script belongs to the script.

examples:
  mpslaunch launch train.py --epochs 3
  mpslaunch launch --dry_run train.py            print the plan, run nothing
  mpslaunch launch --cpu --num_processes 2 train.py
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    import argparse  # only where a parser is built: see without_options

    groups = {
        title: parser.add_argument_group(title) for title in (PLAN, MACHINES, ACCELERATOR, OUTPUT)
    }
    add_table_options(
        parser, *(option.name for option in OPTIONS if option.flag is not None), groups=groups
    )
    parser.add_argument("script", nargs="?", help="the script (or module, with -m) to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def explain_unknown(word: str) -> str | None:
    """The usage error for an unknown word that is an Accelerate launch option mpslaunch does not
    take (what to do instead), else None. Its table is read on this error path only."""
    from mpslaunch.settings import refusal

    return refusal(word)


def without_options(words: list[str]) -> SimpleNamespace | None:
    """The command line `launch SCRIPT [ARGS...]`, with no launch option before the script, as
    the parser reads it: every option at its default, the script, and all that follows for the
    script (tests/commands/test_without_options.py holds the two together). None when the first
    word is an option (or `-m`, or none is given), and where a `--` comes, whose handling
    argparse changes between Python releases: the parser reads those."""
    if not words or words[0].startswith("-") or "--" in words:
        return None
    defaults = {
        option.name: option.request_default for option in OPTIONS if option.flag is not None
    }
    return SimpleNamespace(
        command="launch", handler=main, script=words[0], script_args=words[1:], **defaults
    )


def main(args: Arguments) -> int:
    if args.script is None:
        raise MpslaunchError(
            "no script given: run `mpslaunch launch [options] script.py [script "
            "args]`, or -m and a module name (see `mpslaunch launch --help`)"
        )
    request = request_from_args(args, args.script, args.script_args)
    plan = launcher.prepare(request, args.profile, args.config_file, args.quiet)
    if plan.settings.check and not args.quiet and not plan.silent_rank:
        from mpslaunch.check import before_launch  # only when the check runs

        before_launch.warn(request, plan)
    if args.dry_run:
        print(launcher.describe(plan))
        return 0
    launcher.announce(plan, quiet=args.quiet)
    code = launcher.execute(plan, report=not args.quiet)
    if code == USAGE_ERROR:
        _note_options_after_the_script(args)
    return code


USAGE_ERROR = 2  # argparse's (and click's) exit code for arguments a script does not take


def _note_options_after_the_script(args: Arguments) -> None:
    """The torchrun habit reversed: launch's options written after the script are the script's."""
    from mpslaunch.settings import spellings

    ours = {
        word
        for option in OPTIONS
        if option.spelling
        for word in (*spellings(option.spelling), option.short)
        if word
    }
    given = list(
        dict.fromkeys(
            word.split("=", 1)[0] for word in args.script_args if word.split("=", 1)[0] in ours
        )
    )
    if given:
        names = " and ".join([", ".join(given[:-1]), given[-1]] if len(given) > 1 else given)
        output.note(
            f"the script exited with code 2, as argparse does for arguments it does not "
            f"take; {names} came after {args.script}, so {'they' if len(given) > 1 else 'it'} "
            "went to the script: give launch's options before the script (`mpslaunch "
            "launch [options] script.py [script args]`)",
            args.quiet,
        )
