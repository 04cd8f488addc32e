"""Command-line options shared by several commands, in one spelling policy.

Options take Accelerate's spelling (--num_processes) and the dash form (--num-processes).
"""

from __future__ import annotations


def add_option(container, name: str, **kwargs) -> None:
    """Add `name` (a parser or an argument group), with its dash form when it has underscores."""
    spellings = [name] if "_" not in name else [name, name.replace("_", "-")]
    container.add_argument(*spellings, **kwargs)


def add_profile_options(container, profile_help: str = "named profile from the config folder",
                        file_help: str = "profile file to use") -> None:
    """--profile NAME and --config_file PATH: which profile a command reads or writes."""
    add_option(container, "--profile", metavar="NAME", help=profile_help)
    add_option(container, "--config_file", metavar="PATH", help=file_help)
