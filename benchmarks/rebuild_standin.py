"""TEMPORARY STAND-IN for ``reconcile.rebuild.rebuild``: remove once the engine's own is on main.

It has the signature and report shape announced for the engine's call, so that
``benchmarks/rebuild.py`` runs before it exists: the old expected state read
from the store, the new one recomputed, the two diffed by key and row hash, and
only the differing rows applied through the commit cycle (so the store and the
sink move together, fenced by the cycle's generation), ``part_rows`` rows per
epoch. ``benchmarks/rebuild.py`` uses it only when ``reconcile.rebuild`` has
no ``rebuild``, and says so in its report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import Change
from reconcile.core.hashing import row_hash_arrow
from reconcile.engine.cycle import CommitCycle, CommitSucceeded
from reconcile.rebuild.plan import TablePlan
from reconcile.recovery import diff_tables

__all__ = ["RebuildReport", "TableRebuild", "rebuild"]

_HASH = "_row_hash"


@dataclass
class TableRebuild:
    """One sink table's plan and the rows applied to it."""

    plan: TablePlan
    applied: int = 0


@dataclass
class RebuildReport:
    """Every sink table's rebuild and the seconds each step took."""

    logic_version: str
    tables: dict[str, TableRebuild] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _hashed(rows: pa.Table, keys: list[str]) -> pa.Table:
    values = sorted(c for c in rows.schema.names if c != _HASH)
    return rows.select(keys).append_column(_HASH, row_hash_arrow(rows, values))


def rebuild(
    build: Callable[[], CommitCycle],
    recompute: Callable[[str], pa.Table],
    *,
    logic_version: str,
    apply: bool = True,
    part_rows: int = 50_000,
) -> RebuildReport:
    """Bring every keyed sink of ``build()``'s pipeline to ``recompute``'s state (stand-in)."""
    report = RebuildReport(logic_version)
    clock = time.perf_counter()

    def step(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        report.seconds[name] = report.seconds.get(name, 0.0) + now - clock
        clock = now

    cycle = build()
    try:
        cycle.start()
        step("start")
        state = cycle.expected_state
        assert state is not None, "a rebuild needs the pipeline's expected state"
        for sink, store in state.tables.items():
            keys = list(store.key_columns)
            new = recompute(sink)
            step("recompute")
            old = store.snapshot(columns=new.schema.names)
            step("read_old_state")
            diff = diff_tables(_hashed(new, keys), _hashed(old, keys), keys)
            plan = TablePlan(sink, diff.missing.num_rows, diff.changed.num_rows,
                             diff.extra.num_rows, {})  # fmt: skip
            step("plan")
            done = TableRebuild(plan)
            report.tables[sink] = done
            if not apply:
                continue
            wanted = pa.concat_tables([diff.missing, diff.changed])
            upserts = new.join(wanted, keys, join_type="inner").sort_by(
                [(k, "ascending") for k in keys]
            )
            deletes = [Change("delete", row) for row in diff.extra.to_pylist()]
            step("select_rows")
            epoch = (cycle.progress.last_committed() or 0) + 1
            for at in range(0, max(upserts.num_rows, 1), part_rows):
                part: Any = upserts.slice(at, part_rows)
                if at == 0 and deletes:
                    part = [*deletes, *part.to_pylist()]
                result = cycle.run_epoch(epoch, {sink: part})
                if not isinstance(result, CommitSucceeded):
                    raise RuntimeError(f"rebuild of {sink}: epoch {epoch} ended {result!r}")
                done.applied += len(part) if isinstance(part, list) else part.num_rows
                epoch += 1
            step("apply")
    finally:
        cycle.close()
    return report
