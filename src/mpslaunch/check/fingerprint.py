"""The digest of what a check read, which decides whether kept findings still hold."""

from __future__ import annotations

import os


def digest(data: bytes) -> str:
    try:  # hashlib's own BLAKE2, without hashlib loading OpenSSL (milliseconds at every launch)
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b
    return blake2b(data, digest_size=16).hexdigest()


def listing(folder: str) -> str:
    """The digest of the names of the Python files in a folder ("" when it cannot be listed)."""
    try:
        names = sorted(name for name in os.listdir(folder) if name.endswith(".py"))
    except OSError:
        return ""
    return digest("\n".join(names).encode("utf-8", "surrogateescape"))
