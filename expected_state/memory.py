"""Give the memory a merge or a vacuum freed back to the system, so that RSS follows the work.

A merge reads a run of change files and writes one; a vacuum lists and reads the
log. What they free goes back to the allocator that held it, which keeps it for
reuse: Arrow's pool (mimalloc) keeps the pages of the run it read, and glibc's
``malloc`` keeps its arenas' free chunks (the Python objects and the Rust side of
deltalake allocate there). Between two merges, RSS then stays at the biggest
one's peak, and a long-running pipeline's memory seems to grow with the day
(the scale benchmark's day of epochs: ``benchmarks/scale``). Both are asked to
return what is free.

``malloc_trim`` is glibc's own call, reached through ``ctypes`` since the
standard library has no binding for it; on a system without glibc (musl, macOS)
there is nothing to trim that way and only Arrow's pool is released.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

__all__ = ["release_freed_memory"]


@cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_freed_memory() -> None:
    """Return the free memory of Arrow's pool and of glibc's heap to the system."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
