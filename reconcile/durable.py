"""Durable local writes: fsync a file or folder, and replace a file atomically."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_path", "write_atomically"]


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a folder by path (a folder's fsync makes renames in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Make ``path`` hold ``data``, whole or not at all, durably.

    Writes a sibling ``.tmp`` file, fsyncs it, renames it over ``path`` and
    fsyncs the folder, so a crash at any point leaves either the old file or
    the new one, never a torn one.
    """
    final = Path(path)
    tmp = final.with_name(final.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_path(final.parent)
