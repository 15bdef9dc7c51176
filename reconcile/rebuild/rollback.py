"""Rolling an unfinished rebuild back: the old logic's state whole again, in the store and sinks."""

from __future__ import annotations

from collections.abc import Callable

from expected_state.rebuilds import RebuildLog
from reconcile.core.contract import ConfigurationError
from reconcile.engine.cycle import CommitCycle
from reconcile.rebuild.report import Clock, RebuildReport, TableReport
from reconcile.rebuild.writer import (
    PreemptibleLease,
    append_step,
    as_writer,
    converge,
    store_root,
    tables_of,
)

__all__ = ["rollback", "rollback_label"]


def rollback_label(rebuild: str) -> str:
    """The label of the store commits that roll rebuild ``rebuild`` back."""
    return f"{rebuild}-rollback"


def rollback(
    build: Callable[[], CommitCycle], *, lease: PreemptibleLease | None = None
) -> RebuildReport:
    """Undo the pipeline's unfinished rebuild: the old logic's state back in the store and sinks.

    Each store table the rebuild rebased is rebased again to the state of its
    version before the rebuild (one fenced commit); then every sink is brought
    to the store by a full pull-and-diff, unless the rebuild never reached its
    apply (the sinks were not touched). The log's last step: ``rolled_back``.

    Raises:
        ConfigurationError: the newest rebuild is finished (a switched rebuild is
            undone by a rebuild to the old logic), or there is none.
    """
    report = RebuildReport("", "", None, None)
    clock = Clock(report)
    with as_writer(build, lease, clock) as (cycle, still_leading):
        report.pipeline, report.generation = cycle.pipeline, cycle.generation
        journal = RebuildLog(store_root(cycle), cycle.pipeline)
        newest = journal.newest()
        if newest is None or newest.finished:
            raise ConfigurationError(
                f"pipeline {cycle.pipeline!r}: "
                + ("no rebuild to roll back" if newest is None else
                   f"{newest.describe()} is finished: rebuild to the old logic instead")
                + "; nothing was written"
            )  # fmt: skip
        report.rebuild, report.logic_version = newest.rebuild, newest.logic_version
        report.previous, report.base_epoch = newest.previous, newest.base_epoch
        stores = tables_of(cycle)
        before = newest.detail.get("tables", {})
        report.tables = {n: TableReport(store_before=before.get(n, {}).get("before"))
                         for n in stores}  # fmt: skip
        label = rollback_label(newest.rebuild)
        # The rollback's rebases carry the rebuild's "started" step too: the
        # rebuild log must hold it for as long as the store shows them.
        started = next(e.seq for e in journal.entries()
                       if e.rebuild == newest.rebuild and e.step == "started")  # fmt: skip
        for name, store in stores.items():
            still_leading()
            table = report.tables[name]
            rebased = store.rebased_by(newest.rebuild)
            if rebased is None or table.store_before is None or store.rebased_by(label):
                table.store_after, table.how = store.rebased_by(label), "untouched"
                continue
            with store.holding():  # held from vacuum while it is read
                old = store.state_at_version(table.store_before)
            assert store.user_schema is not None
            back = store.prepare_rebase(old.select(store.user_schema.names),
                                        through=newest.base_epoch)  # fmt: skip
            table.store_after = store.rebase(
                back,
                label=label,
                metadata={"reconcile.logic_version": newest.previous or ""},
                started=started,
            )
        clock.step("store")
        if newest.step != "started":
            converge(cycle, stores, report, still_leading)
        clock.step("apply")
        append_step(journal, report, "rolled_back", cycle)
        return report
