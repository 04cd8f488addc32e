"""The memory a run may use where its control group limits it (a container's `--memory`, a
systemd unit's MemoryMax): the machine's free memory alone would call such a run comfortable
while it thrashes against its limit. Linux only, read from /proc and /sys/fs/cgroup."""

from __future__ import annotations

import os

_UNLIMITED = 2**60  # cgroup v1 writes "no limit" as a number near 2**63
# (root, limit, usage) for cgroup v2 and v1
_LAYOUTS = {
    "v2": ("/sys/fs/cgroup", "memory.max", "memory.current"),
    "v1": ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
}


def memory_limit_left() -> tuple[int, int] | None:
    """(bytes still usable, the limit) under the tightest memory limit on this process's control
    group or one above it; None when none limits it, or off Linux. Usable: the limit less what
    is charged to the group, its page cache too: under a limit the cache is what the group
    takes back from itself (a dataset read through mmap that does not fit shows as inactive
    cache while the group waits on it)."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as lines:
            entries = [line.rstrip("\n").split(":", 2) for line in lines]
    except OSError:
        return None
    found = []
    for entry in entries:
        if len(entry) != 3:
            continue
        number, controllers, path = entry
        if number == "0" and not controllers:
            layout = _LAYOUTS["v2"]
        elif "memory" in controllers.split(","):
            layout = _LAYOUTS["v1"]
        else:
            continue
        limits = (_limit_at(folder, layout) for folder in _folders_up(layout[0], path))
        found += [limit for limit in limits if limit]
    return min(found, default=None)


def _folders_up(root: str, path: str) -> list[str]:
    """The group's folder and each one above it, up to the hierarchy's root."""
    parts = [part for part in path.split("/") if part]
    return [os.path.join(root, *parts[:depth]) for depth in range(len(parts), -1, -1)]


def _limit_at(folder: str, layout: tuple[str, str, str]) -> tuple[int, int] | None:
    _, limit_file, usage_file = layout
    limit, usage = (
        _number(os.path.join(folder, limit_file)),
        _number(os.path.join(folder, usage_file)),
    )
    if limit is None or usage is None or limit >= _UNLIMITED:
        return None
    return max(0, limit - usage), limit


def _number(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as stream:
            text = stream.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit
