"""The one error type users see: a full sentence that says what to do, exit code 2."""


class MpslaunchError(Exception):
    """A usage, profile or device error. The CLI prints it on one line and exits 2."""

    exit_code = 2


def error_line(error: BaseException) -> str:
    """`Type: first line of its message`: torch's errors run to many lines, ours are one."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
