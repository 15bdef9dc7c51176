"""The first item of an iterator computed on a thread of its own, while the caller does other work.

Full mode in parts reads the store's snapshot in parts (``snapshot_parts``):
its first part costs the reading and spilling of every file of the snapshot,
the rest only a merge each. Pulling the sink costs the driver's decoding and
the hashing. The two need different resources (the store's files against the
server and the network), so the store's first part is read while the sink is
pulled, rather than after it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

__all__ = ["read_ahead"]

T = TypeVar("T")


@contextmanager
def read_ahead(items: Iterator[T]) -> Iterator[Iterator[T]]:
    """``items`` again, its first item already being computed on another thread.

    On the way out, after an error too, the thread is waited for and ``items``
    closed (a generator's ``finally`` runs: the store's spilled parts are
    removed). Waiting is bounded by the first item's cost, which for the
    store is one read of its files; a signal the command's guard remembered
    ends that read at its next batch (``interrupts.check`` in the store's loop).

    Raises:
        What computing the first item raised, when the caller asks for it.
    """
    first: list[T] = []
    failed: list[BaseException] = []

    def compute() -> None:
        try:
            first.extend(itertools.islice(items, 1))
        except BaseException as err:  # raised on the caller's thread, when it reads
            failed.append(err)

    worker = threading.Thread(target=compute, name="reconcile-read-ahead", daemon=True)
    worker.start()

    def rest() -> Iterator[T]:
        worker.join()
        if failed:
            raise failed[0]
        yield from first
        yield from items

    try:
        yield rest()
    finally:
        worker.join()
        close = getattr(items, "close", None)
        if close is not None:
            close()
