"""The one error type users see: a full sentence that says what to do, exit code 2."""


class MpslaunchError(Exception):
    """A usage, profile or device error. The CLI prints it on one line and exits 2."""

    exit_code = 2
