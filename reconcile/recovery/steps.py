"""The steps of a check, named for an interruption, and the hook points inside them.

Each pull and each diff of a mode (``finding.py``, ``in_parts.py``) is a step:
SIGINT or SIGTERM there says "the pull of public.orders", and a signal whose
exception a library swallowed on its way up is raised again when the next
step begins.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from reconcile.core import hooks, interrupts

__all__ = ["DIFFING", "PULLING", "check_step"]

# Inside the pull step, with the snapshot open, before the rows are read; and
# inside the diff step, with the rows read, before they are hashed and diffed.
PULLING = hooks.declare("recovery.pulling")
DIFFING = hooks.declare("recovery.diffing")


@contextmanager
def check_step(what: str, point: str | None = None) -> Iterator[None]:
    """One step of a check, named for an interruption; at ``point``, a hook point inside it.

    A signal received before it whose exception was lost on its way up is
    raised here, before the step begins.
    """
    interrupts.check()
    with interrupts.step(what):
        if point is not None:
            hooks.point(point)
        yield
