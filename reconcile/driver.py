"""Drives a pipeline epoch by epoch: retries aborted epochs, restarts after fatal ones."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconcile.contract import ContractViolationError, FatalError, FencedError
from reconcile.cycle import CommitAborted, CommitCycle, CommitResult, CommitSucceeded
from reconcile.faults import SimulatedCrash

__all__ = ["DriveReport", "drive"]

log = logging.getLogger(__name__)


@dataclass
class DriveReport:
    """What a drive did: every cycle result, and how often it retried and restarted."""

    results: list[CommitResult] = field(default_factory=list)
    restarts: int = 0
    retries: int = 0
    committed_epochs: list[int] = field(default_factory=list)


def drive(
    build: Callable[[], CommitCycle],
    epochs: Iterable[int],
    outputs: Callable[[int], Mapping[str, Iterable[Any]]],
    *,
    max_attempts_per_epoch: int = 25,
    on_progress: Callable[[int, CommitResult], None] | None = None,
) -> DriveReport:
    """Run ``epochs`` in order until each one has committed.

    ``build`` makes a fresh cycle over fresh sink clients, as a restarted
    process would; ``outputs(epoch)`` recomputes an epoch's rows (a replay gives
    the same rows). CommitAborted retries the epoch; CommitFatal, a failed
    ``start()`` and a SimulatedCrash restart: a new cycle from ``build``, whose
    ``start()`` resolves what was in doubt, then the same epoch again.

    Raises:
        FatalError: an epoch did not commit within ``max_attempts_per_epoch``.
        OutcomeUnknownError: from ``start()``, which needs an operator.
    """
    report = DriveReport()
    cycle: CommitCycle | None = None
    for epoch in epochs:
        for _attempt in range(max_attempts_per_epoch):
            try:
                if cycle is None:
                    cycle = build()
                    cycle.start()
                result: CommitResult | None = cycle.run_epoch(epoch, outputs(epoch))
            except (ContractViolationError, FencedError):
                raise  # a broken sink or a zombie: restarting cannot fix either
            except (SimulatedCrash, FatalError) as exc:
                # A crash, or a start() that could not resolve the stranded
                # txns (a sink is down, say): restart, up to the attempt limit.
                log.warning("epoch %d: %s; restarting", epoch, exc)
                result = None
            if result is not None:
                report.results.append(result)
                if on_progress is not None:
                    on_progress(epoch, result)
                if isinstance(result, CommitSucceeded):
                    report.committed_epochs.append(epoch)
                    break
                if isinstance(result, CommitAborted):
                    report.retries += 1
                    continue
            # Restart (crash, failed start, CommitFatal). A dead process's
            # connections close with it: so do these.
            _close(cycle)
            cycle = None
            report.restarts += 1
        else:
            raise FatalError(
                f"epoch {epoch} did not commit in {max_attempts_per_epoch} attempts; "
                f"last results: {report.results[-3:]}",
                epoch=epoch,
            )
    _close(cycle)
    return report


def _close(cycle: CommitCycle | None) -> None:
    if cycle is not None:
        cycle.close()
