"""The demo's ``demo_customer_revenue`` output: running revenue totals per customer.

The total of batch ``b`` is the expected state's total as of epoch ``b - 1``
plus the batch's own sum: a re-run of the batch after a crash reads the same
epoch and computes the same total, and the engine applies each epoch once, so
nothing is counted twice.

The totals as of the epoch before are kept between batches
(:class:`RunningTotals`) and rolled forward from what the store recorded for
each epoch since, rather than read whole from the store at every batch: that
read merges every change file of the table, and its cost grows with the
table (a quarter of a second a batch by the end of TPC-H scale 1), where
rolling forward costs one epoch's own rows.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import InvalidInputError

__all__ = ["REVENUE_ARROW", "ROLL_MAX_EPOCHS", "RunningTotals", "revenue_transform"]

REVENUE_ARROW = pa.schema(
    [("o_custkey", pa.int64()), ("revenue", pa.decimal128(18, 4)), ("lines", pa.int64())]
)
# Past this many epochs behind, the totals are read whole instead of rolled forward.
ROLL_MAX_EPOCHS = 16


class RunningTotals:
    """The totals per customer as of one decided epoch, from the store, kept between batches.

    ``as_of(e)`` returns the store's state as of epoch ``e``, whichever way it
    is found:

    - held already (``e`` is the epoch held): as it is;
    - a few epochs ahead of the one held: rolled forward by each later epoch's
      recorded changes (``changes_of``: that epoch's own file), upserts
      replacing a customer's row and deletes removing it;
    - otherwise (the first batch of a process, a batch run again, an epoch
      whose file vacuum removed): read whole (``snapshot``).

    Every row comes from what the store recorded for a decided epoch, never
    from what this process computed for a batch that may not have been
    decided: a batch whose commit failed is computed again from the same
    totals, and a process that restarts reads them from the store.

    Args:
        store: the ``demo_customer_revenue`` table's ``ExpectedStateStore``.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self.epoch: int | None = None
        self.table: pa.Table = REVENUE_ARROW.empty_table()
        self.rolled = 0  # epochs rolled forward (the tests read it)
        self.read_whole = 0  # snapshots read whole

    def as_of(self, epoch: int) -> pa.Table:
        """The totals as of decided epoch ``epoch`` (o_custkey, revenue, lines)."""
        held = self.epoch
        if held is not None and held <= epoch <= held + ROLL_MAX_EPOCHS:
            try:
                table = self.table
                for later in range(held + 1, epoch + 1):
                    table = _roll(table, self.store.changes_of(later))
                    self.rolled += 1
            except InvalidInputError:
                table = self._whole(epoch)  # its file vacuumed, or not recorded: read whole
        else:
            table = self._whole(epoch)
        self.epoch, self.table = epoch, table
        return table

    def _whole(self, epoch: int) -> pa.Table:
        self.read_whole += 1
        state = self.store.snapshot(epoch=epoch, columns=REVENUE_ARROW.names)
        return state.cast(REVENUE_ARROW)


def _roll(table: pa.Table, changes: pa.Table) -> pa.Table:
    """``table`` after one epoch's recorded changes (one row per key, ``_op`` upsert/delete)."""
    if changes.num_rows == 0:
        return table
    keys = changes.column("o_custkey").combine_chunks()
    touched = pc.is_in(table.column("o_custkey"), value_set=keys)
    upserts = changes.filter(pc.equal(changes.column("_op"), "upsert"))
    kept = table.filter(pc.invert(pc.fill_null(touched, False)))
    return pa.concat_tables([kept, upserts.select(REVENUE_ARROW.names).cast(REVENUE_ARROW)])


def revenue_transform(orders: Any, store: Any) -> Any:
    """The ``demo_customer_revenue`` output of a batch: running totals per customer.

    Spark computes the batch's own sum and count per customer (a join with the
    cached ``orders``); the driver adds them to the totals as of the epoch
    before (:class:`RunningTotals`) and hands the rows to the writer as Arrow.
    The totals are at most one row per customer, and adding them on the
    driver takes a few milliseconds, where a broadcast join of them in Spark
    added about 50 ms to a batch's median (more to its tail) on the
    benchmark's 2-core machine.
    """
    from pyspark.sql import functions as F

    totals = RunningTotals(store)

    def previous(batch_id: int) -> pa.Table:
        """The totals as of epoch ``batch_id - 1`` (decided: Spark runs batches in order)."""
        if batch_id == 0 or store.last_epoch() is None:
            return REVENUE_ARROW.empty_table()
        return totals.as_of(batch_id - 1)

    def revenue(batch: Any, batch_id: int) -> pa.Table:
        price = F.col("l_extendedprice") * (F.lit(1) - F.col("l_discount"))
        delta = (
            batch.join(orders, batch.l_orderkey == orders.o_orderkey)
            .groupBy("o_custkey")
            .agg(
                F.sum(price).cast("decimal(18,4)").alias("d"),  # exact: scale 2 times scale 2
                F.count("*").cast("long").alias("n"),
            )
        ).toArrow()
        # Every customer of the batch, with its total before (none: a new customer).
        rows = delta.join(previous(batch_id), "o_custkey", join_type="left outer")
        no_revenue = pa.scalar(0, REVENUE_ARROW.field("revenue").type)
        no_lines = pa.scalar(0, pa.int64())
        return pa.table(
            {
                "o_custkey": rows["o_custkey"],
                "revenue": pc.add(pc.coalesce(rows["revenue"], no_revenue), rows["d"]),
                "lines": pc.add(pc.coalesce(rows["lines"], no_lines), rows["n"]),
            }
        ).cast(REVENUE_ARROW)

    revenue.totals = totals  # type: ignore[attr-defined]  # for the tests
    return revenue
