"""Durable local writes: fsync a file or folder, and replace a file atomically."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_path", "write_all", "write_atomically"]


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a folder by path (a folder's fsync makes renames in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a short write is not an error).

    Raises:
        OSError: from the write; a write that makes no progress raises too.
    """
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(f"write made no progress ({written} of {len(view)} bytes)")
        view = view[written:]


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Make ``path`` hold ``data``, whole or not at all, durably.

    Writes a sibling ``.tmp`` file, fsyncs it, renames it over ``path`` and
    fsyncs the folder, so a crash at any point leaves either the old file or
    the new one, never a torn one.
    """
    final = Path(path)
    tmp = final.with_name(final.name + ".tmp")
    # O_NOFOLLOW: a symlink planted at the temp name is refused, not written
    # through; 0600: what the engine writes is its own (the umask may narrow it).
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    fd = os.open(tmp, flags, 0o600)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    fsync_path(final.parent)
