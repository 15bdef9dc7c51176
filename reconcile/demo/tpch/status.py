"""A spinner that names the demo's step under way, on a terminal only."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["status_line"]


@contextlib.contextmanager
def status_line(console: Console, shown: bool, what: str) -> Iterator[Callable[[str], object]]:
    """A spinner naming the step under way (on a terminal); yields a function to rename it.

    The steps before and after the epochs' bar (generating TPC-H, verifying
    millions of rows) take tens of seconds at scale 1: a silent terminal
    would look hung.
    """
    if not shown:
        yield lambda _: None
        return
    with console.status(what) as spinner:
        yield lambda text: spinner.update(text)
