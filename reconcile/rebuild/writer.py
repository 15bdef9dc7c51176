"""The rebuild as the pipeline's writer: the lease, the takeover's steps, the fenced log steps.

Shared by the rebuild, its resume and its rollback (``reconcile.rebuild.run``,
``reconcile.rebuild.rollback``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from expected_state.rebuilds import RebuildEntry, RebuildLog
from expected_state.store import ExpectedStateStore
from reconcile.core.contract import ConfigurationError, InvalidInputError
from reconcile.core.lease import Lease, LeaseState
from reconcile.core.sink import capabilities_of
from reconcile.engine.cycle import CommitCycle
from reconcile.rebuild.report import Clock, RebuildReport, TableReport
from reconcile.recovery.api import recover_sink
from reconcile.recovery.modes import Mode

__all__ = [
    "PreemptibleLease",
    "append_step",
    "as_writer",
    "check_generation",
    "converge",
    "decided_epoch",
    "fresh_tables",
    "store_root",
    "tables_of",
]

log = logging.getLogger("reconcile.rebuild")


class PreemptibleLease(Lease, Protocol):
    """A lease the rebuild can take from a live holder (``sinks.postgres.lease.PgLease``)."""

    def preempt(self) -> LeaseState:
        """Take the lease now, whoever holds it."""
        ...


def tables_of(cycle: CommitCycle) -> dict[str, ExpectedStateStore]:
    """The sink tables a rebuild converges: every keyed sink; each must be pullable."""
    expected = cycle.expected_state
    if expected is None:
        raise ConfigurationError(
            f"pipeline {cycle.pipeline!r}: a rebuild needs the pipeline's expected state"
        )
    stores = expected.tables
    for name in stores:
        if not capabilities_of(cycle.sinks[name]).pullable:
            raise ConfigurationError(
                f"pipeline {cycle.pipeline!r}: sink {name!r} cannot be pulled from, so it "
                "cannot be rebuilt by diff; nothing was written"
            )
    return dict(sorted(stores.items()))


def fresh_tables(
    cycle: CommitCycle, stores: dict[str, ExpectedStateStore]
) -> dict[str, ExpectedStateStore]:
    """New objects of ``stores``' tables, as the cycle's expected state opens them."""
    expected = cycle.expected_state
    assert expected is not None
    return {
        name: ExpectedStateStore(
            expected.root,
            cycle.pipeline,
            name,
            store.key_columns,
            schema=expected.schemas.get(name),
            generation=store.generation,
            column_types=store.column_types,
        )
        for name, store in stores.items()
    }


def store_root(cycle: CommitCycle) -> str:
    assert cycle.expected_state is not None
    return cycle.expected_state.root


def decided_epoch(cycle: CommitCycle) -> int:
    epoch = cycle.progress.last_committed()
    if epoch is None:
        raise InvalidInputError(
            f"pipeline {cycle.pipeline!r}: no epoch was decided yet; there is nothing to rebuild"
        )
    return epoch


@contextmanager
def as_writer(
    build: Callable[[], CommitCycle], lease: PreemptibleLease | None, clock: Clock
) -> Iterator[tuple[CommitCycle, Callable[[], None]]]:
    """The pipeline's writer: the lease taken, a generation claimed, every sink fenced."""
    # Here, not at the top: the takeover's steps need the Postgres driver, and
    # the command line imports this package whether or not it rebuilds.
    from reconcile.ha.leading import Heartbeat
    from reconcile.ha.takeover import LeadershipLostError, fence_sinks, terminate_old_sessions

    heartbeat = None
    if lease is not None:
        lease.preempt()
        heartbeat = Heartbeat(lease, lease.term_s / 4)
        heartbeat.start()

    def still_leading() -> None:
        # Between steps: a rebuild that lost its lease stops before its next
        # write (its generation would fence it anyway, inside that write).
        if heartbeat is not None and heartbeat.lost.is_set():
            raise LeadershipLostError(
                f"the rebuild lost the lease of pipeline {lease.pipeline if lease else ''!r}: "
                "stopping; run it again"
            )

    cycle = build()
    cycle.rebuilding = True
    try:
        terminate_old_sessions(cycle)
        cycle.start()
        fence_sinks(cycle)
        clock.step("take_over")
        yield cycle, still_leading
    finally:
        cycle.close()
        if heartbeat is not None:
            heartbeat.done.set()
        if lease is not None:
            lease.release()


def append_step(
    journal: RebuildLog, report: RebuildReport, step: str, cycle: CommitCycle
) -> RebuildEntry:
    # Fenced: a rebuild whose generation another writer superseded stops here
    # (the progress log's newest claim is checked first); a step it appended late
    # anyway sorts below the newer writer's (the log orders by generation).
    assert report.rebuild is not None and report.base_epoch is not None
    generation = report.generation or 0
    check_generation(cycle, generation)
    detail: dict[str, Any] = {"tables": {n: {"before": t.store_before, "after": t.store_after}
                                         for n, t in report.tables.items()}}  # fmt: skip
    if report.app:
        detail["app"] = report.app
    entry = journal.append(rebuild=report.rebuild, generation=generation, step=step,
                           logic_version=report.logic_version, previous=report.previous,
                           base_epoch=report.base_epoch, detail=detail)  # fmt: skip
    report.step = step
    log.info("%s", entry.describe())
    return entry


def check_generation(cycle: CommitCycle, generation: int) -> None:
    check = getattr(cycle.progress, "check_writer", None)
    if check is None:  # a progress log of the library's own making, without claims to check
        return
    check(generation)


def converge(cycle: CommitCycle, stores: dict[str, ExpectedStateStore], report: RebuildReport,
              still_leading: Callable[[], None]) -> None:  # fmt: skip
    """Every sink to its store table by a full pull-and-diff, the brake lifted."""
    assert report.base_epoch is not None and report.generation is not None
    for name, store in stores.items():
        still_leading()
        # The whole table may differ from the sink (a rebuild changes what its
        # logic changes): the mass-change brake guards against drift, not this.
        found = recover_sink(cycle.sinks[name], store, report.generation, mode=Mode.FULL,
                             after_crash=False, target_epoch=report.base_epoch,
                             max_change_fraction=1.0)  # fmt: skip
        table = report.tables.setdefault(name, TableReport())
        table.applied, table.how = found.applied, "full pull-and-diff"
