"""The digest of what a check read, which decides whether kept findings still hold."""

from __future__ import annotations


def digest(data: bytes) -> str:
    try:  # hashlib's own BLAKE2, without hashlib loading OpenSSL (milliseconds at every launch)
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b
    return blake2b(data, digest_size=16).hexdigest()
