"""The user's config and cache folders: where platformdirs puts them, worked out without it where
the answer is plain (mpslaunch.user_folder), so that a launch needs no platformdirs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from platformdirs.macos import MacOS
from platformdirs.unix import Unix

from helpers import write_script
from mpslaunch import plain_user_folder, user_folder

PLATFORMDIRS = {"linux": Unix, "darwin": MacOS}
HOMES = ["/home/ada", "/home/ada/", "/", "/Users/Ada Lovelace"]
MOVED = [None, "", "/data/ada/xdg", "relative/xdg", " /padded", "~/xdg"]


def platformdirs_answer(kind: str, platform: str, monkeypatch, environ: dict) -> str:
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    folders = PLATFORMDIRS[platform](appname="mpslaunch", appauthor=False)
    return getattr(folders, f"user_{kind}_dir")


@pytest.mark.parametrize("platform", ["linux", "darwin"])
@pytest.mark.parametrize("kind, variable", [("config", "XDG_CONFIG_HOME"), ("cache", "XDG_CACHE_HOME")])
@pytest.mark.parametrize("home", HOMES)
@pytest.mark.parametrize("moved", MOVED)
def test_a_plain_answer_is_platformdirs_answer(platform, kind, variable, home, moved, monkeypatch):
    environ = {"HOME": home, **({} if moved is None else {variable: moved})}
    plain = plain_user_folder(kind, platform, environ)
    if plain is not None:
        assert plain == platformdirs_answer(kind, platform, monkeypatch, environ)


@pytest.mark.parametrize("platform", ["linux", "darwin"])
@pytest.mark.parametrize("kind", ["config", "cache"])
def test_the_usual_cases_are_plain(platform, kind):
    """No XDG variable, or on Linux an absolute one: no platformdirs needed."""
    assert plain_user_folder(kind, platform, {"HOME": "/home/ada"}) is not None
    if platform == "linux":
        variable = "XDG_CONFIG_HOME" if kind == "config" else "XDG_CACHE_HOME"
        assert plain_user_folder(kind, platform, {"HOME": "/home/ada", variable: "/x"}) == "/x/mpslaunch"


@pytest.mark.parametrize("environ", [{}, {"HOME": "relative"}, {"HOME": "/h", "ANDROID_DATA": "/data"},
                                     {"HOME": "/h", "XDG_CACHE_HOME": "relative"}])
def test_what_is_not_plain_is_left_to_platformdirs(environ):
    assert plain_user_folder("cache", "linux", environ) is None
    assert plain_user_folder("cache", "win32", {"HOME": "/h"}) is None


def test_the_mpslaunch_variables_come_first(monkeypatch, tmp_path):
    monkeypatch.setenv("MPSLAUNCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MPSLAUNCH_CONFIG_DIR", "~/profiles")
    assert user_folder("cache") == str(tmp_path / "cache")
    assert user_folder("config") == os.path.expanduser("~/profiles")


# A launch where platformdirs cannot be imported, as on a machine without it.
WITHOUT_PLATFORMDIRS = """
import sys
sys.modules["platformdirs"] = None
from mpslaunch.commands import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the plain answer on this machine's platform")
def test_a_launch_needs_no_platformdirs(tmp_path):
    """The default path (the check before the launch keeps its findings in the cache folder)."""
    script = write_script(tmp_path, "train.py", "print('ran')\n")
    home = tmp_path / "home"
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith(("MPSLAUNCH_", "XDG_"))}
    done = subprocess.run([sys.executable, "-c", WITHOUT_PLATFORMDIRS, "launch", str(script)],
                          capture_output=True, text=True, timeout=120, env={**environ, "HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran\n"
    assert [path.name for path in (home / ".cache" / "mpslaunch").iterdir()] == ["script-checks"]
