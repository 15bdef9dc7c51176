"""Pull-and-diff on a Delta table: one version scanned into Arrow, a repair in ONE fenced commit.

Both Delta sinks are served by this one target: ``delta://`` (written by
delta-rs, ``sinks.delta.sink``) and ``delta+spark://`` (written by Spark's
Delta, ``sinks.delta_spark.sink``). Both write the same log: the epoch token
``<pipeline>/<sink>`` (the high-water mark), the generation fence
(``sinks.delta.tokens``) and an ``_epoch`` column; so one reader and one
writer (delta-rs, a base dependency: no JVM is started to verify or repair)
do for both.

The pull reads the version that was newest when it began (a ``DeltaTable``
loaded at that version: every later commit is invisible to it), the expected
state's columns only, batch by batch through a pyarrow scanner (bounded
memory). Scoped mode filters the scan on the staged keys and on ``_epoch``
past the sink's newest epoch; deltalake gives each file's Delta statistics to
the dataset, so files that cannot match are skipped unread. Buckets mode needs
checksums computed by the sink's system; Delta has none, and this says so.

The repair (``sinks.delta.rewrite``) is one Delta commit: the files holding a
changed or extra key are replaced by their rows without those keys, and the
expected rows are added. It is based on the version the pull read, with no
retry: a commit that landed since (a writer's epoch, a takeover's claim, a
hand write) makes it lose the race for the next log version, nothing is
written, and the engine pulls again. It carries the epoch token at the target
epoch and the generation fence, as the sink's own commit does, so a replay of
an older epoch is refused and a newer generation fences it off.

The limit of one writer: a table Spark's Delta made with a protocol feature
delta-rs cannot write faithfully (deletion vectors, column mapping, CHECK
constraints, generated or identity columns, change data feed, ...) is
refused by the repair, naming the table and the feature, before anything is
written; verify still reads it where deltalake can.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
import pyarrow.dataset as pds  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import DeltaProtocolError

from reconcile.core.conform import SinkColumn
from reconcile.core.contract import ConfigurationError, InvalidInputError, SinkTxnId
from reconcile.core.target import NoRowChecksums, Progress, Repair
from sinks.delta.rewrite import apply_repair
from sinks.delta.rows import EPOCH_COLUMN, state_schema
from sinks.delta.tokens import epoch_app_id, fence_id, open_table

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["DeltaRecoveryTarget", "arrow_kind"]

# Rows handed to the engine at a time: the scanner's batches, never the table.
_BATCH_ROWS = 64 * 1024


def arrow_kind(typ: pa.DataType) -> str:
    """The recovery kind (``SinkColumn.kind``) of a Delta column's Arrow type."""
    checks: list[tuple[Callable[[pa.DataType], bool], str]] = [
        (pa.types.is_boolean, "bool"),
        (pa.types.is_integer, "int"),
        (pa.types.is_decimal, "numeric"),
        (pa.types.is_float64, "float8"),
        (pa.types.is_float32, "float4"),
        (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "text"),
        (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), "bytes"),
        (pa.types.is_date32, "date"),
    ]
    for check, kind in checks:
        if check(typ):
            return kind
    if pa.types.is_timestamp(typ):
        return "timestamp" if typ.tz is None else "timestamptz"
    return "other"


class _Snapshot(NoRowChecksums):
    """One Delta version of the table (the protocol ``SinkSnapshot``)."""

    system = "Delta"
    target: DeltaRecoveryTarget

    def __init__(self, target: DeltaRecoveryTarget, table: DeltaTable | None,
                 schema: pa.Schema, keys: list[str]) -> None:  # fmt: skip
        self.target, self.table, self.schema, self.keys = target, table, schema, keys
        self.newest_epoch = None if table is None else target.newest_epoch(table)
        self.warnings: list[str] = []
        # Files are skipped by their statistics, never read by a key range's index.
        self.narrow_ranges = False
        self._estimate: int | None = None

    def _empty(self) -> pa.Table:
        return self.schema.empty_table()

    def _scanner(self, row_filter: pds.Expression | None, *, with_epoch: bool = False) -> Any:
        assert self.table is not None
        try:
            dataset = self.table.to_pyarrow_dataset()
        except DeltaProtocolError as exc:
            raise InvalidInputError(
                f"Delta table {self.target.display}: deltalake cannot read it ({exc}); "
                "nothing was pulled or written",
                table=self.target.display,
            ) from None
        columns = list(self.schema.names)
        if with_epoch and EPOCH_COLUMN not in columns:
            columns.append(EPOCH_COLUMN)  # read to match rows, never handed on
        return dataset.scanner(columns=columns, filter=row_filter, batch_size=_BATCH_ROWS)

    def pull_all(self, progress: Progress | None) -> pa.Table:
        """Every row of the version, the expected state's columns (the table's own types)."""
        parts: list[pa.Table] = []
        self.pull_each(parts.append, progress)
        return pa.concat_tables(parts) if parts else self._empty()

    def pull_each(self, each: Callable[[pa.Table], None], progress: Progress | None) -> None:
        """Every row, handed to ``each`` a batch at a time (one batch in memory)."""
        if self.table is None:
            return
        pulled = 0
        for batch in self._scanner(None).to_batches():
            if batch.num_rows:
                each(pa.Table.from_batches([batch]))
                pulled += batch.num_rows
                if progress is not None:
                    progress(pulled, self.estimated_rows())

    def estimated_rows(self) -> int | None:
        """The rows the log's add actions count (exact without deletion vectors)."""
        if self.table is None:
            return 0
        if self._estimate is None:  # read once: the version does not change
            actions = pa.table(self.table.get_add_actions(flatten=True))
            self._estimate = int(pc.sum(actions.column("num_records")).as_py() or 0)
        return self._estimate

    def pull_keys(self, keys: pa.Table, newer_than: int) -> pa.Table:
        """The rows of the staged keys, and the rows whose ``_epoch`` is past ``newer_than``."""
        # The pinned version's schema: no second read of the log.
        if self.table is None or EPOCH_COLUMN not in self.target.schema_of(self.table).names:
            raise InvalidInputError(
                f"table {self.target.display} has no {EPOCH_COLUMN} column, which scoped mode "
                "needs; use mode full",
                table=self.target.display,
            )
        first = self.keys[0]
        later = pds.field(EPOCH_COLUMN) > newer_than
        values = None
        if keys.num_rows:
            # In the table's own type, so that the filter compares like with like.
            typ = self.target.schema_of(self.table).field(first).type
            values = pc.unique(keys.column(first).combine_chunks()).cast(typ)
        scope = later if values is None else later | pds.field(first).isin(values)
        # The filter skips files by their Delta statistics, then takes rows exactly
        # on the first key column; further key columns are matched below.
        if len(self.keys) == 1 or values is None:
            return self._scanner(scope).to_table()
        rows = self._scanner(scope, with_epoch=True).to_table()
        rows = rows.append_column("__row", pa.array(range(rows.num_rows), pa.int64()))
        wanted = pc.fill_null(pc.greater(rows.column(EPOCH_COLUMN), newer_than), False)
        typed = keys.select(self.keys).cast(pa.schema([rows.schema.field(k) for k in self.keys]))
        matched = rows.select([*self.keys, "__row"]).join(typed, self.keys, join_type="left semi")
        wanted = pc.or_(wanted, pc.is_in(rows.column("__row"), value_set=matched.column("__row")))
        return rows.filter(wanted).select(self.schema.names)

    def count_rows(self) -> int:
        """The rows of the version (what the mass-change brake weighs)."""
        if self.table is None:
            return 0
        return int(self._scanner(None).count_rows())


class DeltaRecoveryTarget:
    """The ``RecoveryTarget`` of one Delta table, written by either Delta sink."""

    bucket_checksums = False

    def __init__(self, uri: str, sink: str, pipeline: str, generation: int | None, *,
                 key: Sequence[str], log_id: str | None, write: bool) -> None:  # fmt: skip
        """Serve the table at ``uri`` of sink ``sink`` for ``pipeline``.

        Args:
            uri: the table's root folder.
            sink: the sink's name, as its tokens name it.
            pipeline: the pipeline, as its tokens name it.
            generation: the writer generation the repair runs as; None: an
                operator's repair, which keeps the recorded fence.
            key: the key columns (``?key=``); empty: the store's.
            log_id: the bound writer's progress-log id (recorded in the commit).
            write: False for a verify (the repair is never called).
        """
        self.uri, self.sink, self.pipeline, self.generation = uri, sink, pipeline, generation
        self.key, self.log_id, self.write = list(key), log_id, write
        # The log's app ids, named as the sinks name them (sinks.delta.tokens).
        tokens = SinkTxnId(pipeline, sink, 0, 0)
        self.app_id, self.fence_app = epoch_app_id(tokens), fence_id(tokens)
        self.pulled_version: int | None = None

    @property
    def display(self) -> str:
        return self.uri

    def _table(self) -> DeltaTable | None:
        return open_table(self.uri)

    def newest_epoch(self, table: DeltaTable) -> int | None:
        """The sink's high-water mark in ``table``'s version (its epoch token)."""
        version = table.transaction_version(self.app_id)
        return None if version is None else int(version)

    @property
    def epoch_column(self) -> bool:
        table = self._table()
        return table is not None and EPOCH_COLUMN in self.schema_of(table).names

    @staticmethod
    def schema_of(table: DeltaTable) -> pa.Schema:
        """``table``'s Arrow schema, ``_epoch`` included (``sinks.delta.rows.state_schema``)."""
        schema = state_schema(table)
        assert schema is not None  # a loaded table has one
        return schema

    def columns(self) -> dict[str, SinkColumn]:
        table = self._table()
        if table is None:
            raise InvalidInputError(
                f"Delta table {self.uri} does not exist; nothing was pulled or written",
                table=self.uri,
            )
        return {
            f.name: SinkColumn(f.name, arrow_kind(f.type), str(f.type))
            for f in self.schema_of(table)
        }

    def key_columns(self) -> list[str]:
        if not self.key:
            raise ConfigurationError(
                f"Delta table {self.uri} has no key of its own: give it (?key=k1,k2 on "
                "the URL, or the keys option)"
            )
        return list(self.key)

    @contextmanager
    def snapshot(self, schema: pa.Schema, keys: list[str]) -> Iterator[_Snapshot]:
        # A DeltaTable is loaded at one version: its scans read that version,
        # whatever commits after; the repair is based on the same version.
        table = self._table()
        self.pulled_version = None if table is None else table.version()
        yield _Snapshot(self, table, schema, keys)

    def apply(self, repair: Repair) -> int | None:
        """The repair as ONE Delta commit based on the version the pull read.

        Returns None (nothing written) if the sink's newest epoch moved since
        the pull, or any commit landed after that version: the caller pulls again.

        Raises:
            FencedError: a newer writer generation holds the table.
            InvalidInputError: the target epoch is older than the sink's newest,
                or the table has a protocol feature delta-rs cannot write.
        """
        # Based on the version the pull read; an apply without a pull (a rebuild,
        # which holds the fence) on the newest one.
        pulled, self.pulled_version = self.pulled_version, None
        table = self._table() if pulled is None else DeltaTable(self.uri, version=pulled)
        if table is None:
            raise InvalidInputError(
                f"Delta table {self.uri} does not exist; a repair cannot create it "
                "(run the pipeline's first epoch); nothing was written",
                table=self.uri,
            )
        return apply_repair(self, table, repair)

    def close(self) -> None:
        """Nothing to close: each read opens the log afresh."""
