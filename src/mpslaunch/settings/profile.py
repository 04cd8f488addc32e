"""Profiles: what the user wants, as plain data. The schema and its checks; nothing here reads
or writes a file (profile_files.py does).

A profile knows nothing about the machine. Its keys, types, defaults and checks come from the
option table (options.py), shared with the command line and the Python API.
"""

from __future__ import annotations

import dataclasses

from mpslaunch.settings.options import BY_NAME, PROFILE_OPTIONS, dataclass_of

MPS_KEYS = ("mps_fallback", "mps_memory_cap", "keep_awake")  # they mean something on a Mac only


def _replace(self, **changes: object) -> "Profile":
    return dataclasses.replace(self, **changes)


def _to_dict(self) -> dict[str, object]:
    return dataclasses.asdict(self)


Profile = dataclass_of("Profile", PROFILE_OPTIONS, "A profile: every key with its value.",
                       lambda option: option.default, replace=_replace, to_dict=_to_dict,
                       module=__name__)
KNOWN_KEYS = tuple(option.name for option in PROFILE_OPTIONS)


def check_value(key: str, value: object) -> str | None:
    """Why `value` is not allowed for `key`, or None. Shared by files, flags and the questionnaire."""
    return BY_NAME[key].problem(value)


def check_profile(profile: Profile) -> str | None:
    """Rules that tie several keys together; the reason the combination is wrong, or None."""
    if profile.machine_rank >= profile.num_machines:
        return (f"machine_rank {profile.machine_rank} must be below num_machines "
                f"{profile.num_machines} (ranks count from 0)")
    if profile.num_machines > 1 and not profile.main_process_ip:
        return "num_machines is above 1, so main_process_ip (the address of machine 0) is needed"
    return None
