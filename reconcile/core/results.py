"""What the commit cycle returns: the result of each epoch, and the report of a start()."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sized
from dataclasses import dataclass, field
from typing import Any

from reconcile.core.contract import ReconcileError

__all__ = [
    "CommitAborted",
    "CommitFatal",
    "CommitResult",
    "CommitSucceeded",
    "RecoveryReport",
    "log_result",
]


@dataclass(frozen=True)
class CommitSucceeded:
    """Epoch ``epoch`` is in every sink.

    ``replayed`` is True exactly when nothing was written because the epoch
    was already in; ``finalized`` is False when the epoch is in every sink but
    the progress log could not record it as finalized yet (start() does).
    """

    epoch: int
    replayed: bool = False
    finalized: bool = True


@dataclass(frozen=True)
class CommitAborted:
    """Nothing of ``epoch`` is visible anywhere; run the same epoch again.

    ``error`` is the typed cause, when a sink or the log gave one.
    """

    epoch: int
    step: str
    reason: str
    error: ReconcileError | None = field(default=None, compare=False)


@dataclass(frozen=True)
class CommitFatal:
    """The cycle must stop.

    ``restart`` says what may help:

    - True: something is in doubt (the commit point's write had no answer, a
      sink could not commit an epoch past the commit point). A restart's
      ``start()`` settles it from the log, so restarting is the cure;
    - False: no retry can succeed (a Fatal outcome before the commit point,
      bad input, a fenced zombie, a marker of another state). Stop and report
      ``error``.
    """

    epoch: int
    step: str
    reason: str
    error: ReconcileError | None = field(default=None, compare=False)
    restart: bool = field(default=True, compare=False)


CommitResult = CommitSucceeded | CommitAborted | CommitFatal


@dataclass
class RecoveryReport:
    """What ``start()`` found and did, as numbers and txn ids."""

    generation: int
    committed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    finalized_epochs: list[int] = field(default_factory=list)
    abandoned_epochs: list[int] = field(default_factory=list)
    # Committed epochs that sinks without a durable prepare still lack: the
    # next run_epoch() of that epoch replays its outputs into them.
    replay_needed: dict[int, list[str]] = field(default_factory=dict)
    # Sinks brought to their expected state by pull-and-diff (a stranded txn of
    # an epoch the log no longer knows was rolled back): rows applied per sink.
    repaired: dict[str, int] = field(default_factory=dict)


def log_result(
    log: logging.Logger,
    pipeline: str,
    generation: int | None,
    result: CommitResult,
    outputs: Mapping[str, Iterable[Any]],
    seconds: float,
) -> None:
    """One INFO line per epoch (WARNING when aborted, ERROR when fatal)."""
    # Every value the cycle runs is sized: a list (iterators are listed before
    # the cycle runs), an Arrow table, rows staged in files or by executors.
    rows = sum(len(v) for v in outputs.values() if isinstance(v, Sized))
    ms = seconds * 1000
    if isinstance(result, CommitSucceeded):
        what = "replayed (already in)" if result.replayed else "committed"
        log.info(
            "pipeline %s epoch %d %s: %d rows, %.1f ms, generation %s",
            pipeline,
            result.epoch,
            what,
            rows,
            ms,
            generation,
        )
    else:
        level = logging.WARNING if isinstance(result, CommitAborted) else logging.ERROR
        log.log(
            level,
            "pipeline %s epoch %d %s at %s: %s (%.1f ms)",
            pipeline,
            result.epoch,
            "aborted" if isinstance(result, CommitAborted) else "FATAL",
            result.step,
            result.reason,
            ms,
        )
