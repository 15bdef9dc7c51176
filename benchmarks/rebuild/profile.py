"""Where the rebuild's client time goes: py-spy sampling this process, summed by function.

``with Profile(path): ...`` runs ``py-spy record --format raw --nonblocking``
against this process for the block (py-spy reads the process's memory without
stopping it, so the figures it samples are not slowed); :func:`summary` sums
the raw stacks into each function's share of the samples, inclusive (anywhere
on the stack) and self (the innermost Python frame: time in C++ or Rust that a
Python call started is counted on that call).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["Profile", "summary"]

RATE = 50  # samples a second: enough for steps of a second or more, light on two cores


class Profile:
    """py-spy on this process for a ``with`` block; ``path`` gets its raw stacks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Profile:
        spy = shutil.which("py-spy")
        if spy is None:
            raise RuntimeError("--profile needs py-spy on the PATH (pip install py-spy)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        command = [spy, "record", "--pid", str(os.getpid()), "--format", "raw",
                   "--rate", str(RATE), "--nonblocking", "-o", str(self.path)]  # fmt: skip
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        time.sleep(1.0)  # py-spy attaches before the block starts
        if self._process.poll() is not None:
            out = self._process.stdout.read() if self._process.stdout else b""
            raise RuntimeError(f"py-spy could not sample this process: {out.decode()[-400:]}")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        self._process.communicate(timeout=60)


def _function(frame: str) -> str:
    """``name (path/to/module.py:123)`` -> ``name (module.py)``."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rsplit(':', 1)[0]).name})" if where else name


def _ours(frame: str) -> bool:
    return "(benchmarks/" in frame or "(<frozen" in frame


def summary(path: Path, top: int = 12) -> dict[str, Any]:
    """The samples, and the ``top`` functions by inclusive and by self share of them."""
    inclusive: Counter[str] = Counter()
    itself: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = stack.split(";")
        itself[_function(frames[-1])] += n
        # The benchmark's own frames and the interpreter's are on every stack: they
        # would top the inclusive list and say nothing.
        for function in {_function(f) for f in frames if not _ours(f)}:
            inclusive[function] += n

    def share(counter: Counter[str]) -> list[list[Any]]:
        return [[f, round(c / samples, 3)] for f, c in counter.most_common(top)] if samples else []

    return {"samples": samples, "rate_hz": RATE, "inclusive": share(inclusive),
            "self": share(itself)}  # fmt: skip
