"""Rebuild by diff: bring a pipeline's sinks to new logic, writing only the rows that differ.

``rebuild(build, recompute, logic_version=...)`` runs the steps below as the
pipeline's writer. Each step is durable in the store's rebuild log
(``expected_state.rebuilds``) before the next one begins, and while the log's
newest step is unfinished no writer may start (``CommitCycle.start()``
refuses): a kill anywhere leaves either the old logic whole (the store and the
sinks untouched, or rolled back) or a mix the log names, which the next
``rebuild`` with the same logic version resumes, or ``rollback`` undoes.

1. The lease, taken from whoever holds it (``preempt``): a running main steps
   down at its next renewal, a standby keeps waiting. Then the takeover's
   steps: the old writer's sessions ended, a generation claimed (the store's
   fence), every sink fenced, every sink brought to the newest decided epoch
   E (scoped pull-and-diff). From here a zombie is rejected everywhere.
2. ``recompute(sink)``: each table's expected state under the new logic as of
   E (from the retained input), and what it changes against the store
   (``prepare_rebase``: the new rows hashed once, the old state's stored
   hashes read), which is the plan. Nothing written yet. Log: ``started``.
3. Each store table rebased: one fenced Delta commit puts that difference in
   the file of epoch E, labelled with the rebuild and the logic version. Log:
   ``stored``.
4. Each sink: that same difference, in bounded fenced transactions
   (``reconcile.rebuild.apply``). Log: ``applied``.
5. The switch. Log: ``switched``: from now on only a writer of the new
   logic version may start (``reconcile.engine.logic``); it resumes at E+1.

A resume after a kill in step 4 does not know which parts landed: it brings
each sink to the store by a full pull-and-diff (its mass-change brake lifted:
the rebuild changes what it changes). ``rollback`` rebases each store table
back to the version before the rebuild and brings the sinks to it the same way.
A rollback killed once it rebased a store table is finished by the next
``rollback`` only: a ``rebuild`` over it is refused, since the store no longer
holds the new logic's state.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypedDict, Unpack, cast

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.rebasing import Rebase
from expected_state.rebuilds import RebuildEntry, RebuildLog
from expected_state.store import ExpectedStateStore
from reconcile.core import hooks
from reconcile.core.contract import ConfigurationError, InvalidInputError
from reconcile.core.target import PullableSink
from reconcile.engine.cycle import CommitCycle
from reconcile.rebuild.apply import (
    DEFAULT_PART_ROWS,
    apply_difference,
    difference_of,
    difference_of_versions,
    rebuild_mode,
)
from reconcile.rebuild.plan import TablePlan, check_unique, plan_of
from reconcile.rebuild.report import Clock, RebuildReport, TableReport
from reconcile.rebuild.rollback import rollback_label
from reconcile.rebuild.writer import (
    PreemptibleLease,
    append_step,
    as_writer,
    converge,
    decided_epoch,
    fresh_tables,
    store_root,
    tables_of,
)

__all__ = [
    "REBUILD_APPLIED",
    "REBUILD_STARTED",
    "REBUILD_STORED",
    "plan",
    "rebuild",
]

log = logging.getLogger("reconcile.rebuild")

# After each step is durable in the rebuild log (the kill points of its tests).
REBUILD_STARTED = hooks.declare("rebuild.started")
REBUILD_STORED = hooks.declare("rebuild.stored")
REBUILD_APPLIED = hooks.declare("rebuild.applied")

Recompute = Callable[[str], pa.Table]
Progress = Callable[[str, int, int], None]  # (what, done, in all)


def _announce(progress: Progress | None, what: str) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(what, done, total)


def _prepare(
    stores: dict[str, ExpectedStateStore], recompute: Recompute, epoch: int, sample: int
) -> tuple[dict[str, Rebase], dict[str, TablePlan]]:
    """Each table's rebase, found from the new logic's state (nothing written), and its plan."""
    prepared, plans = {}, {}
    for name, store in stores.items():
        new = recompute(name)
        if not isinstance(new, pa.Table):
            raise InvalidInputError(
                f"rebuild of sink {name!r}: the new logic gave {type(new).__name__}, not an "
                "Arrow table of the sink's rows"
            )
        check_unique(new, store.key_columns, name)
        with store.holding():  # the version it compares with, held while it reads
            prepared[name] = store.prepare_rebase(new, through=epoch)
        del new  # the rebase keeps the rows it writes only
        plans[name] = plan_of(name, prepared[name], sample)
    return prepared, plans


class LogicNames(TypedDict, total=False):
    """What a rebuild's caller knows of the logics by name.

    Attributes:
        previous: the logic in force, when no earlier rebuild named it.
        app: the app the new logic runs as (``package.module:function``), kept
            in the rebuild log so that a run of it afterwards carries the new
            logic version (``reconcile run``).
    """

    previous: str | None
    app: str | None


def plan(build: Callable[[], CommitCycle], recompute: Recompute, *, logic_version: str,
         sample: int = 5, previous: str | None = None) -> RebuildReport:  # fmt: skip
    """What a rebuild to ``logic_version`` would write: per table, the rows it would
    insert, update and delete, with a sample. Reads only: no lease, no generation.
    ``previous``: the logic in force, when no earlier rebuild named it (as for ``rebuild``).

    Raises:
        InvalidInputError: nothing was decided yet, or the new logic's rows do not
            fit (a repeated or NULL key; naming the table).
    """
    cycle = build()
    try:
        newest = RebuildLog(store_root(cycle), cycle.pipeline).newest()
        epoch = decided_epoch(cycle)
        report = RebuildReport(cycle.pipeline, logic_version,
                               newest.logic_in_force if newest else previous, epoch)  # fmt: skip
        clock = Clock(report)
        _, plans = _prepare(tables_of(cycle), recompute, epoch, sample)
        report.tables = {name: TableReport(plan=p) for name, p in plans.items()}
        clock.step("plan")
        return report
    finally:
        cycle.close()


def rebuild(
    build: Callable[[], CommitCycle],
    recompute: Recompute,
    *,
    logic_version: str,
    lease: PreemptibleLease | None = None,
    part_rows: int = DEFAULT_PART_ROWS,
    sample: int = 5,
    progress: Progress | None = None,
    **names: Unpack[LogicNames],
) -> RebuildReport:
    """Converge every sink of the pipeline to ``recompute``'s new logic (see the module docs).

    Args:
        build: a new ``CommitCycle`` of the pipeline (its sinks and expected state).
        recompute: sink name -> its expected state under the new logic as of the
            newest decided epoch (the user columns, one row per key).
        logic_version: the new logic's name; only a writer of it may start after.
        lease: the pipeline's lease, taken first (None: the caller made sure no
            writer runs; the generation fences one that does).
        part_rows: rows per sink transaction.
        sample: keys per kind in each table's plan.
        progress: called with (what, done, in all) after each sink transaction.
        **names: ``previous`` and ``app`` (``LogicNames``).

    Returns:
        The report; ``step`` is "switched" once done.

    Raises:
        ConfigurationError: an unfinished rebuild to another logic version (finish
            or roll it back first), a sink that cannot be pulled from.
        InvalidInputError: nothing decided yet; the new rows do not fit a table.
        FencedError, LeadershipLostError: another writer took over; run it again.
        RetryableError: a database or the store failed; run it again (it resumes).
    """
    if not logic_version or not isinstance(logic_version, str):
        raise ConfigurationError(f"logic_version must be a non-empty string, got {logic_version!r}")
    previous = names.get("previous")
    report = RebuildReport("", logic_version, previous, None, app=names.get("app"))
    clock = Clock(report)
    with as_writer(build, lease, clock) as (cycle, still_leading):
        report.pipeline, report.generation = cycle.pipeline, cycle.generation
        journal = RebuildLog(store_root(cycle), cycle.pipeline)
        newest = journal.newest()
        stores = tables_of(cycle)
        if newest is not None and not newest.finished:
            if newest.logic_version != logic_version:
                raise ConfigurationError(
                    f"{newest.describe()} is unfinished: finish it with logic version "
                    f"{newest.logic_version!r}, or roll it back, before a rebuild to "
                    f"{logic_version!r}; nothing was written"
                )
            # A rollback that rebased a store table back before it was killed left
            # the old state in the store under the rebuild's step: a resume would
            # take it for the new logic's and switch to it. Only a rollback ends it.
            rolled = [n for n, s in stores.items()
                      if s.rebased_by(rollback_label(newest.rebuild)) is not None]  # fmt: skip
            if rolled:
                raise ConfigurationError(
                    f"{newest.describe()}: a rollback of it was interrupted after it put the "
                    f"old state back in the store of {', '.join(rolled)}; run the rollback "
                    "again to finish it; nothing was written"
                )
            report.resumed = True
            return _resume(cycle, stores, (journal, newest), recompute, report, clock,
                           still_leading, (part_rows, progress))  # fmt: skip
        report.previous = newest.logic_in_force if newest is not None else previous
        from reconcile.ha.takeover import recover_sinks  # the driver: see writer.as_writer

        epoch = report.base_epoch = decided_epoch(cycle)
        # The new state is compared with the store alone, which bringing the sinks
        # to epoch E does not change: the two run side by side, each on store
        # objects of its own (a store object has one user at a time).
        with ThreadPoolExecutor(1, thread_name_prefix="rebuild-prepare") as pool:
            planning = pool.submit(_prepare, fresh_tables(cycle, stores), recompute, epoch, sample)
            recover_sinks(cycle)  # every sink at the newest decided epoch: the old state
            clock.step("recover")
            prepared, plans = planning.result()
        clock.step("recompute_and_plan")
        # When it began (UTC), and a random tail for two begun in the same second.
        report.rebuild = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
        report.tables = {
            name: TableReport(plan=plans[name], store_before=_version(store))
            for name, store in stores.items()
        }
        entry = append_step(journal, report, "started", cycle)
        hooks.point(REBUILD_STARTED)
        _rebase_all(stores, prepared, entry, report, still_leading)
        clock.step("store")
        append_step(journal, report, "stored", cycle)
        hooks.point(REBUILD_STORED)
        _apply_all(cycle, stores, report, prepared, (part_rows, progress), still_leading)
        clock.step("apply")
        return _finish(journal, report, cycle, still_leading, clock)


def _version(store: ExpectedStateStore) -> int:
    return int(DeltaTable(store.uri).version())


def _rebase_all(stores: dict[str, ExpectedStateStore], prepared: dict[str, Rebase],
                entry: RebuildEntry, report: RebuildReport,
                still_leading: Callable[[], None]) -> None:  # fmt: skip
    for name, store in stores.items():
        still_leading()
        table = report.tables[name]
        table.store_after = store.rebased_by(entry.rebuild)
        if table.store_after is None:
            table.store_after = store.rebase(
                prepared[name], label=entry.rebuild,
                metadata={"reconcile.logic_version": entry.logic_version}, started=entry.seq,
            )  # fmt: skip


def _apply_all(cycle: CommitCycle, stores: dict[str, ExpectedStateStore], report: RebuildReport,
               prepared: dict[str, Rebase], parts: tuple[int, Progress | None],
               still_leading: Callable[[], None]) -> None:  # fmt: skip
    """Each sink: what its store table's rebase changed, in bounded transactions.

    The difference found by this process when it has one; else (a rebase made
    before a kill) the difference of the store's versions before and after.
    """
    assert report.rebuild is not None and report.base_epoch is not None
    mode = rebuild_mode(report.rebuild, report.logic_version)
    for name, store in stores.items():
        still_leading()
        table = report.tables[name]
        if name in prepared:
            difference = difference_of(prepared[name], mode)
        else:
            assert table.store_before is not None and table.store_after is not None
            difference = difference_of_versions(store, table.store_before, table.store_after,
                                                report.base_epoch, mode)  # fmt: skip
        done = apply_difference(cast(PullableSink, cycle.sinks[name]), store,
                                report.generation or 0, difference, parts[0],
                                _announce(parts[1], f"applying {name}"))  # fmt: skip
        table.applied, table.parts, table.how = done.rows, done.parts, "diff"


def _resume(cycle: CommitCycle, stores: dict[str, ExpectedStateStore],
            unfinished: tuple[RebuildLog, RebuildEntry], recompute: Recompute,
            report: RebuildReport, clock: Clock, still_leading: Callable[[], None],
            parts: tuple[int, Progress | None]) -> RebuildReport:  # fmt: skip
    """Finish an unfinished rebuild (the log and its newest step) from that step."""
    journal, newest = unfinished
    report.rebuild, report.previous = newest.rebuild, newest.previous
    report.app = newest.detail.get("app") or report.app  # the app the rebuild began with
    report.base_epoch, report.step = newest.base_epoch, newest.step
    if decided_epoch(cycle) != newest.base_epoch:
        raise InvalidInputError(
            f"{newest.describe()}: the newest decided epoch is {decided_epoch(cycle)}, not the "
            "rebuild's; the store was changed by hand: roll it back; nothing was written"
        )
    before = newest.detail.get("tables", {})
    report.tables = {n: TableReport(store_before=before.get(n, {}).get("before"),
                                    store_after=before.get(n, {}).get("after"))
                     for n in stores}  # fmt: skip
    if newest.step == "started":
        # No sink was touched yet (the apply begins once "stored" is durable):
        # rebase what is left, then apply the difference as a first run does.
        left = {n: s for n, s in stores.items() if s.rebased_by(newest.rebuild) is None}
        prepared, _ = _prepare(left, recompute, newest.base_epoch, 0)
        clock.step("recompute_and_plan")
        _rebase_all(stores, prepared, newest, report, still_leading)
        clock.step("store")
        append_step(journal, report, "stored", cycle)
        hooks.point(REBUILD_STORED)
        _apply_all(cycle, stores, report, prepared, parts, still_leading)
    elif newest.step == "stored":
        converge(cycle, stores, report, still_leading)
    clock.step("apply")
    return _finish(journal, report, cycle, still_leading, clock)


def _finish(journal: RebuildLog, report: RebuildReport, cycle: CommitCycle,
            still_leading: Callable[[], None], clock: Clock) -> RebuildReport:  # fmt: skip
    if report.step != "applied":
        append_step(journal, report, "applied", cycle)
    hooks.point(REBUILD_APPLIED)
    still_leading()
    append_step(journal, report, "switched", cycle)
    clock.step("switch")
    return report
