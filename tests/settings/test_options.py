"""The option table (options.py) is the one declaration of each launch option and profile key:
the launch parser, LaunchOptions, mpslaunch.launch(), the profile and its checks follow it."""

from __future__ import annotations

import pytest

from mpslaunch import commands as cli
from mpslaunch.launcher import api
from mpslaunch.settings import (OPTIONS, PROFILE_OPTIONS, REQUEST_OPTIONS, LaunchOptions,
                                LaunchRequest, Profile, check_value)


def launch_parser():
    return cli.build_parser("launch").command_parser


@pytest.mark.parametrize("option", OPTIONS, ids=lambda option: option.name)
def test_each_option_is_where_the_table_says_and_nowhere_else(option):
    actions = launch_parser()._option_string_actions
    if option.spelling:
        dash = option.spelling.replace("_", "-")
        assert actions[option.spelling] is actions[dash] and actions[dash].dest == option.name
        if option.short:
            assert actions[option.short] is actions[option.spelling]
    else:
        assert f"--{option.name}" not in actions
    assert (option.name in LaunchOptions._fields) == option.request
    assert (option.name in api.OPTIONS) == option.request
    profile_fields = Profile._field_defaults
    assert (option.name in profile_fields) == option.profile
    if option.profile:
        assert profile_fields[option.name] == option.default
        assert check_value(option.name, option.default) is None


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.spelling and o.kind is not bool],
                         ids=lambda option: option.name)
def test_a_flag_refuses_what_its_profile_key_refuses_in_the_same_words(option):
    """A value the table refuses, typed on the command line: `--name why`, the profile's words."""
    bad = {int: "-1", float: "-1", str: "not valid!"}[option.kind]
    value = option.kind(bad) if option.kind is not str else bad
    why = option.problem(value)
    if why is None:  # any value of this type is allowed (an address, a folder)
        return
    with pytest.raises(ValueError, match=f"^{option.spelling} ") as caught:
        option.parse(bad)
    assert str(caught.value) == f"{option.spelling} {why}"


@pytest.mark.parametrize("written, options, default", [
    (LaunchOptions, REQUEST_OPTIONS, lambda option: option.request_default),
    (Profile, PROFILE_OPTIONS, lambda option: option.default),
], ids=["LaunchOptions", "Profile"])
def test_the_records_are_the_table_written_out(written, options, default):
    """Each field in the table's order, with the option's type (or None when not given) and
    default: an option added to the table and not to the record (or the other way) fails."""
    assert list(written._fields) == [option.name for option in options]
    for name, option in zip(written._fields, options):
        kind = option.kind.__name__ + (" | None" if default(option) is None else "")
        assert (written.__annotations__[name], written._field_defaults[name]) == (kind, default(option))


def test_a_request_is_its_options_then_what_to_run():
    assert LaunchRequest._fields == (*LaunchOptions._fields, "target", "target_args")
    request = LaunchRequest("train.py", ("--epochs", "1"), cpu=True)
    assert (request.target, request.target_args, request.cpu, request.device) == \
        ("train.py", ("--epochs", "1"), True, None)
