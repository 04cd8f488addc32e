"""YAML aliases: a few hundred bytes that name billions of items are refused in one line, in an
Accelerate config (launch --config_file, config --from_accelerate) and in an mpslaunch profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import one_line_error, run_cli
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import profile_files

ACCELERATE_HEAD = ("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\n"
                   "mixed_precision: 'no'\nnum_processes: 1\n")


def laughs(levels: int, key: str = "tpu_env", head: str = ACCELERATE_HEAD) -> str:
    """A config whose `key` holds 9**levels off values built from anchors, in ~50 bytes a level."""
    nested = ["&l0 ['no', 'no', 'no', 'no', 'no', 'no', 'no', 'no', 'no']"]
    nested += [f"&l{level} [{', '.join([f'*l{level - 1}'] * 9)}]" for level in range(1, levels)]
    return head + f"{key}: [{', '.join(nested)}]\n"


def write(folder: Path, text: str, name: str = "bomb.yaml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("key", ["tpu_env", "fsdp_config"])
def test_an_alias_bomb_in_an_accelerate_config_is_refused(tmp_path, key):
    path = write(tmp_path, laughs(6, key))
    assert len(path.read_bytes()) < 1024
    for reader in (profile_files.read, profile_files.read_accelerate):
        with pytest.raises(MpslaunchError, match="aliases"):
            reader(path)


def test_an_alias_bomb_in_an_mpslaunch_profile_is_refused(tmp_path):
    path = write(tmp_path, laughs(12, "mixed_precision", head="device: cpu\n"))
    with pytest.raises(MpslaunchError, match="mixed_precision|aliases"):
        profile_files.read(path)


def test_aliases_a_real_file_uses_still_read(tmp_path):
    text = ("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: &p 'no'\n"
            "num_processes: 1\ndowncast_bf16: *p\ntpu_env: &t ['', '']\ncommands: *t\n")
    assert profile_files.read(write(tmp_path, text)).profile.mixed_precision == "no"


@pytest.mark.slow
def test_launch_and_import_refuse_an_alias_bomb_at_once(tmp_path):
    # Twelve levels: 9**12 items, which nothing could walk; before the refusal, this hung.
    path = write(tmp_path, laughs(12))
    script = write(tmp_path, "print('ran')\n", "ok.py")
    launched = run_cli("launch", "--config_file", str(path), "--dry_run", str(script), timeout=60)
    assert "aliases" in one_line_error(launched, longest=300)
    imported = run_cli("config", "--from_accelerate", str(path), config_dir=tmp_path / "cfg",
                       timeout=60)
    assert "aliases" in one_line_error(imported, longest=300)
