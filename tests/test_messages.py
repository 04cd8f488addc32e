"""Messages that name what the user really typed, and numbers too large for any timeout.

An option given before the command's name is said to belong after it (not "did you mean" the
same option); a value that came from the profile is named by its key and file, not as a flag;
a UTF-16 or BOM-marked profile is read as the text it is; --rdzv_timeout and the profile's
rdzv_timeout have an upper bound, one line and exit 2 instead of an OverflowError.
"""

from __future__ import annotations

import codecs

import pytest

from helpers import MACHINES, one_line_error, run_cli, write_script
from mpslaunch.settings import profile_files
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import RDZV_TIMEOUT_MAX, LaunchRequest
from mpslaunch.plan import resolve
from mpslaunch.settings import Profile


@pytest.mark.slow
@pytest.mark.parametrize("command, option", [("launch", "--cpu"), ("bench", "--cpu"),
                                             ("launch", "--dry_run")])
def test_an_option_given_before_the_command_is_said_to_belong_after_it(tmp_path, command, option):
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    message = one_line_error(run_cli(option, command, str(script)))
    assert f"give it after `{command}`, as in `mpslaunch {command} {option} ...`" in message
    assert "did you mean" not in message
    assert not (tmp_path / "train.py.ran").exists()


@pytest.mark.slow
def test_a_profile_value_is_named_by_its_key_and_file(tmp_path):
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    profile = tmp_path / "many.yaml"
    profile.write_text("device: cpu\nnum_processes: 64\n")
    message = one_line_error(run_cli("launch", "--config_file", str(profile), str(script)))
    assert f"num_processes: 64 in {profile}" in message
    assert "--num_processes 64" not in message
    flag = one_line_error(run_cli("launch", "--config_file", str(profile), "--num_processes", "63",
                                  str(script)))
    assert "(--num_processes 63)" in flag and str(profile) not in flag
    assert not (tmp_path / "train.py.ran").exists()


def test_a_profile_value_without_a_file_is_named_as_the_profile_s():
    """A Profile made in Python has no file to name, and was no flag."""
    request = LaunchRequest(target="train.py", cpu=True)
    with pytest.raises(MpslaunchError, match=r"\(num_processes: 64 in the profile\)"):
        resolve(Profile(num_processes=64), request, MACHINES["linux_cpu"], {})


PROFILE_TEXT = "device: cpu\nnum_processes: 2\n"


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le-bom", "utf-16-be-bom", "utf-8-sig",
                                      "utf-32"])
def test_a_profile_marked_with_a_byte_order_mark_is_read_as_text(tmp_path, encoding):
    marks = {"utf-16-le-bom": (codecs.BOM_UTF16_LE, "utf-16-le"),
             "utf-16-be-bom": (codecs.BOM_UTF16_BE, "utf-16-be")}
    mark, codec = marks.get(encoding, (b"", encoding))
    path = tmp_path / "p.yaml"
    path.write_bytes(mark + PROFILE_TEXT.encode(codec))
    assert profile_files.load(path) == Profile(device="cpu", num_processes=2)


def test_a_utf16_profile_without_its_mark_is_named_as_utf16(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_bytes(PROFILE_TEXT.encode("utf-16-le"))
    with pytest.raises(MpslaunchError, match="looks like UTF-16 text without a byte-order mark; "
                                             "save it as UTF-8"):
        profile_files.load(path)


@pytest.mark.slow
def test_a_utf16_profile_through_the_cli(tmp_path):
    script = write_script(tmp_path, "train.py", "print('ran')\n")
    path = tmp_path / "p.yaml"
    path.write_bytes("device: cpu\n".encode("utf-16"))  # as Windows editors save "Unicode"
    result = run_cli("launch", "-q", "--config_file", str(path), str(script))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran\n"


@pytest.mark.slow
@pytest.mark.parametrize("value", [99999999999999, RDZV_TIMEOUT_MAX + 1])
def test_a_rendezvous_timeout_too_long_for_any_clock_is_refused(tmp_path, value):
    script = write_script(tmp_path, "train.py", "open(__file__ + '.ran', 'w')\n")
    two_machines = ["--cpu", "--num_machines", "2", "--main_process_ip", "127.0.0.1"]
    for rank in ("0", "1"):
        message = one_line_error(run_cli("launch", *two_machines, "--machine_rank", rank,
                                         "--rdzv_timeout", str(value), "--dry_run", str(script)))
        assert f"--rdzv_timeout must be from 1 to {RDZV_TIMEOUT_MAX} seconds" in message
    path = tmp_path / "p.yaml"
    path.write_text(f"rdzv_timeout: {value}\n")
    with pytest.raises(MpslaunchError, match="line 1: rdzv_timeout must be from 1 to"):
        profile_files.load(path)
    assert not (tmp_path / "train.py.ran").exists()


@pytest.mark.slow
def test_the_longest_rendezvous_timeout_is_accepted(tmp_path):
    script = write_script(tmp_path, "train.py", "")
    result = run_cli("launch", "--cpu", "--num_machines", "2", "--main_process_ip", "127.0.0.1",
                     "--machine_rank", "1", "--rdzv_timeout", str(RDZV_TIMEOUT_MAX),
                     "--dry_run", str(script))
    assert result.returncode == 0, result.stderr
