"""Profiles: what the user wants, as plain data. The schema and its checks; nothing here reads
or writes a file (profile_files.py does).

A profile knows nothing about the machine. Its keys, types, defaults and checks are the option
table's profile keys (options.py), shared with the command line and the Python API;
tests/settings/test_options.py holds the fields to the table.
"""

from __future__ import annotations

import re

from mpslaunch import Record, record
from mpslaunch.settings.options import BY_NAME, PROFILE_OPTIONS, PROFILE_VERSION, RDZV_TIMEOUT, cut

MPS_KEYS = ("mps_fallback", "mps_memory_cap", "keep_awake")  # they mean something on a Mac only


@record
class Profile(Record):
    """A profile: every key with its value."""

    version: int = PROFILE_VERSION
    # what to run on
    device: str = "auto"
    mixed_precision: str = "no"
    num_processes: int | None = None  # None: one per NVIDIA GPU, else 1
    # several machines
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_ip_via_nat: bool = False
    main_process_port: int = 0
    # how torch.distributed.run meets the ranks
    rdzv_backend: str = "static"
    rdzv_timeout: int = RDZV_TIMEOUT
    max_restarts: int = 0
    slurm: bool = True  # read the machines and ranks from an srun step
    # on a Mac: PYTORCH_ENABLE_MPS_FALLBACK, PYTORCH_MPS_HIGH_WATERMARK_RATIO
    mps_fallback: bool = True
    mps_memory_cap: float | None = None
    gpu_ids: str | None = None
    # torch.compile, for the script's Accelerator
    dynamo_backend: str = "no"
    dynamo_mode: str = "default"
    dynamo_use_fullgraph: bool = False
    dynamo_use_dynamic: bool = False
    dynamo_use_regional_compilation: bool = False
    # more for the script's Accelerator, and what runs beside the script
    debug: bool = False
    check: bool = True
    keep_awake: bool = True

    def replace(self, **changes: object) -> Profile:
        return self._replace(**changes)

    @property
    def processes(self) -> int:
        """num_processes once the plan has decided it (it fills None, one per GPU, in first)."""
        if self.num_processes is None:
            raise ValueError("num_processes is read before the plan decides it")
        return self.num_processes

    def to_dict(self) -> dict[str, object]:
        """Every key and its value (only the profile's keys, from a Settings too)."""
        return {name: getattr(self, name) for name in Profile._fields}

    def named(self, key: str) -> str:
        """The key and its value, as a message names them (Settings also says where from)."""
        return f"{key} {getattr(self, key)}"


KNOWN_KEYS = tuple(option.name for option in PROFILE_OPTIONS)


def check_value(key: str, value: object) -> str | None:
    """Why `value` is not allowed for `key`, or None. Shared by files, flags and the questionnaire."""
    return BY_NAME[key].problem(value)


def check_profile(profile: Profile) -> str | None:
    """Rules that tie several keys together; the reason the combination is wrong, or None."""
    if profile.machine_rank >= profile.num_machines:
        return (
            f"{profile.named('machine_rank')} must be below {profile.named('num_machines')}, "
            "since ranks count from 0"
        )
    if profile.num_machines > 1 and not profile.main_process_ip:
        return (
            f"{profile.named('num_machines')} is above 1, so main_process_ip (the address of "
            "machine 0) is needed"
        )
    return None


def unknown_keys_problem(keys: list[tuple[str, int]]) -> str | None:
    """Every key of (key, line) that is not a profile key, each with the nearest known key, in
    one sentence; None when all are known."""
    import difflib  # only when a key is wrong

    unknown = [(key, line) for key, line in keys if key not in KNOWN_KEYS]
    if not unknown:
        return None
    named = []
    for key, line in unknown:
        close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
        named.append(
            f"line {line}: unknown key {cut(repr(key))}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
        )
    return f"{'; '.join(named)}; known keys: {', '.join(KNOWN_KEYS)}"


# YAML 1.1 reads 8:20 as the base-60 number 500, and 010 as the octal number 8. Compiled (and
# kept by re) when a profile file is read: a launch without one needs neither.
_BASE_60 = r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?"
_OCTAL = r"[-+]?0[0-7_]+"


def written_number_problem(text: str, value: object) -> str | None:
    """Why a number as the file spells it (`text`, unquoted) is not what a person means by it,
    though YAML reads it as `value`; None when it is."""
    if re.fullmatch(_BASE_60, text):
        return (
            f"is written {text}, which YAML reads as the base-60 number {value}; write the "
            "number itself"
        )
    if re.fullmatch(_OCTAL, text) and text.lstrip("+-") != "0":
        return (
            f"is written {text}, which YAML reads as the octal number {value} (a leading 0); "
            "write it without the 0"
        )
    return None
