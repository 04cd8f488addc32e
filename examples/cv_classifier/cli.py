"""Command-line pieces: the program's name, InputError (bad input: one line on stderr, exit
code 2), the parser that raises it and the argument types."""

from __future__ import annotations

import argparse


PROG = "cv_example"


class InputError(Exception):
    """Bad input from the user: reported as one line and exit code 2."""


def first_line(error: BaseException) -> str:
    """An exception's message cut to its first line (torch's run to pages)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        raise InputError(message)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def checkpointing_steps(text: str) -> str | int:
    if text == "epoch":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected 'epoch' or a number of steps, got {text!r}")
