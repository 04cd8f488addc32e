"""Profiles: round trips, every malformed file, atomic writes, where they live."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from helpers import refusal_of
from mpslaunch.settings import options, profile as profiles, profile_files
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import Profile


def load_text(tmp_path: Path, text: str | bytes) -> Profile:
    path = tmp_path / "p.yaml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return profile_files.load(path)


def load_error(tmp_path: Path, text: str | bytes) -> str:
    with pytest.raises(MpslaunchError) as caught:
        load_text(tmp_path, text)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_round_trip(tmp_path):
    original = Profile(device="cpu", mixed_precision="bf16", num_processes=4, mps_fallback=False,
                       mps_memory_cap=1.25, num_machines=2, machine_rank=1, main_process_ip="10.1.2.3",
                       main_process_port=29500, rdzv_backend="c10d", max_restarts=3)
    path = tmp_path / "sub" / "p.yaml"
    profile_files.save(original, path)
    assert profile_files.load(path) == original


def test_partial_profile_takes_defaults(tmp_path):
    assert load_text(tmp_path, "device: cpu\n") == Profile(device="cpu")


@pytest.mark.parametrize("text, expected", [
    ("device: [cpu\n", "not valid YAML"),
    ("- device\n- cpu\n", "line 1: a profile is a mapping"),
    ("just text\n", "a profile is a mapping"),
    ("", "is empty"),
    ("# only a comment\n", "is empty"),
    ("device: cpu\nnum_procesess: 2\n", "line 2: unknown key 'num_procesess' (did you mean 'num_processes'?)"),
    ("device: gpu\n", "device must be one of auto, mps, cuda, cpu"),
    ("num_processes: two\n", "num_processes must be int or null, not str"),
    ("num_processes: true\n", "num_processes must be int or null, not bool"),
    ("num_processes: 0\n", "num_processes must be 1 or more"),
    ("main_process_port: -1\n", "main_process_port must be a TCP port"),
    ("main_process_port: 70000\n", "main_process_port must be a TCP port"),
    ("mps_memory_cap: 2.5\n", "mps_memory_cap must be from 0.0"),
    ("mps_memory_cap: -0.1\n", "mps_memory_cap must be from 0.0"),
    ("mps_fallback: 1\n", "mps_fallback must be bool"),
    ("version: 99\n", "upgrade mpslaunch"),
    ("device: cpu\ndevice: mps\n", "line 2: device is set twice"),
    ("? [a, b]\n: 1\n", "keys must be plain names"),
    ("device: !!python/object/apply:os.system ['touch /tmp/pwned']\n", "could not determine a constructor"),
    ("machine_rank: 1\n", "machine_rank 1 must be below num_machines 1"),
    ("num_machines: 2\n", "main_process_ip"),
    ("gpu_ids: 0 1\n", "gpu_ids must be GPU numbers separated by commas"),
    ("dynamo_backend: INDUCTOR\n", "dynamo_backend must be one of no, eager"),
])
def test_malformed_profiles_name_the_problem(tmp_path, text, expected):
    message = load_error(tmp_path, text)
    assert expected in message
    assert str(tmp_path / "p.yaml") in message


@pytest.mark.parametrize("text, expected", [
    ("main_process_port: 8:20\n", "main_process_port is written 8:20, which YAML reads as the "
     "base-60 number 500; write the number itself"),
    ("max_restarts: 1:00:00\n", "max_restarts is written 1:00:00, which YAML reads as the "
     "base-60 number 3600"),
    ("mps_memory_cap: 1:30.5\n", "mps_memory_cap is written 1:30.5, which YAML reads as the "
     "base-60 number 90.5"),
    ("main_process_port: 029500\n", "main_process_port must be int, not str '029500'"),  # YAML: text
    ("num_processes: 010\n", "num_processes is written 010, which YAML reads as the octal number "
     "8 (a leading 0); write it without the 0"),
    ("max_restarts: 100000000000000000000\n", "max_restarts must be at most 10,000 (each one "
     "starts every rank again), not 100000000000000000000"),
    ("num_machines: 1_000_000\n", "num_machines must be at most 65,536"),
    ("num_processes: 70000\n", "num_processes must be at most 65,536"),
    ("mps_memory_cap: .inf\n", "mps_memory_cap must be from 0.0"),
    ("mps_memory_cap: .nan\n", "mps_memory_cap must be from 0.0"),
    ("rdzv_timeout: .inf\n", "rdzv_timeout must be int, not float inf"),
    ("device: cpu\ndevise: cpu\nmixed_precison: no\n", "line 2: unknown key 'devise' (did you "
     "mean 'device'?); line 3: unknown key 'mixed_precison' (did you mean 'mixed_precision'?); "
     "known keys: version, "),
])
def test_numbers_a_person_would_not_mean_and_every_unknown_key_are_refused(tmp_path, text, expected):
    assert expected in load_error(tmp_path, text)


@pytest.mark.parametrize("text, value", [
    ("main_process_port: 0x7530\n", 30000), ("main_process_port: 29_500\n", 29500),
    ("main_process_port: 0\n", 0), ("max_restarts: 10000\n", 10000),
    ("mps_memory_cap: 1.5\n", 1.5), ("main_process_port: '8:20'\n", None),
])
def test_numbers_written_as_meant_are_read(tmp_path, text, value):
    key = text.split(":")[0]
    if value is None:  # quoted: text, which the type check refuses as it is
        assert f"{key} must be int, not str '8:20'" in load_error(tmp_path, text)
    else:
        assert getattr(load_text(tmp_path, text), key) == value


def test_object_tags_are_never_constructed(tmp_path):
    marker = tmp_path / "pwned"
    load_error(tmp_path, f"device: !!python/object/apply:os.system ['touch {marker}']\n")
    assert not marker.exists()


def test_binary_and_huge_files_are_refused(tmp_path):
    # Not \xff\xfe: that is UTF-16's byte-order mark, and such a profile is read as UTF-16.
    assert "not a text file" in load_error(tmp_path, b"\xff\xfd\x00garbage")
    huge = tmp_path / "p.yaml"
    with huge.open("wb") as stream:
        stream.truncate(50 * 1024 * 1024)  # a 50 MB sparse file
    with pytest.raises(MpslaunchError, match="far too big"):
        profile_files.load(huge)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(MpslaunchError, match="mpslaunch config"):
        profile_files.load(tmp_path / "absent.yaml")
    with pytest.raises(MpslaunchError, match="is a folder"):
        profile_files.load(tmp_path)


def test_save_is_atomic_and_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "default.yaml"
    profile_files.save(Profile(device="cpu"), path)
    before = path.read_bytes()

    def disk_full(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        profile_files.save(Profile(device="mps"), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["default.yaml"]  # no temp file left


def test_save_replaces_a_planted_symlink_instead_of_following_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "default.yaml"
    link.symlink_to(victim)
    profile_files.save(Profile(), link)
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and profile_files.load(link) == Profile()


def test_save_honours_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        profile_files.save(Profile(), tmp_path / "p.yaml")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "p.yaml").stat().st_mode) == 0o640


def test_locations(tmp_path, isolated_config_dir):
    assert profile_files.profile_path() == isolated_config_dir / "default.yaml"
    assert profile_files.profile_path(profile_name="fast") == isolated_config_dir / "fast.yaml"
    assert profile_files.profile_path(config_file=str(tmp_path / "x.yaml")) == tmp_path / "x.yaml"
    for bad in ("../evil", "a/b", "x.yaml", ""):
        if bad:
            with pytest.raises(MpslaunchError, match="plain name"):
                profile_files.profile_path(profile_name=bad)
    with pytest.raises(MpslaunchError, match="not both"):
        profile_files.profile_path(config_file="a.yaml", profile_name="b")


def test_active_profile(isolated_config_dir):
    assert profile_files.read_active() == profile_files.ProfileFile(Profile(), None)  # no default: defaults, nothing required
    with pytest.raises(MpslaunchError, match="no profile at"):
        profile_files.read_active(profile_name="missing")
    profile_files.save(Profile(device="cpu"), isolated_config_dir / "default.yaml")
    assert profile_files.read_active().profile.device == "cpu"


# ---------------------------------------------------------------- property-based

# The keys not drawn keep their defaults (hypothesis would draw every annotated field of a
# record given to st.builds).
valid_profiles = st.fixed_dictionaries(dict(
    device=st.sampled_from(options.DEVICES),
    mixed_precision=st.sampled_from(options.PRECISIONS),
    num_processes=st.integers(1, 1024),
    num_machines=st.just(1),
    machine_rank=st.just(0),
    main_process_ip=st.none() | st.from_regex(r"[a-z0-9.\-]{1,30}", fullmatch=True),
    main_process_port=st.integers(0, 65535),
    rdzv_backend=st.sampled_from(options.RDZV_BACKENDS),
    max_restarts=st.integers(0, 100),
    mps_fallback=st.booleans(),
    mps_memory_cap=st.none() | st.floats(0.0, 2.0),
    gpu_ids=st.none() | st.just("all") | st.from_regex(r"\d(,\d){0,3}", fullmatch=True),
    dynamo_backend=st.sampled_from(options.DYNAMO_BACKENDS),
    dynamo_mode=st.sampled_from(options.DYNAMO_MODES),
    dynamo_use_fullgraph=st.booleans(),
    debug=st.booleans(),
)).map(lambda values: Profile(**values))


@settings(max_examples=150, deadline=None)
@given(valid_profiles)
def test_every_valid_profile_round_trips(tmp_path_factory, profile):
    path = tmp_path_factory.mktemp("rt") / "p.yaml"
    profile_files.save(profile, path)
    assert profile_files.load(path) == profile


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(profiles.KNOWN_KEYS) | st.text(max_size=15), yaml_values, max_size=6))
def test_random_documents_raise_only_our_error(tmp_path_factory, document):
    path = tmp_path_factory.mktemp("fuzz") / "p.yaml"
    path.write_text(yaml.safe_dump(document))
    assert "\n" not in (refusal_of(lambda: profile_files.load(path)) or "")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_random_text_raises_only_our_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("text") / "p.yaml"
    path.write_text(text)
    refusal_of(lambda: profile_files.load(path))
