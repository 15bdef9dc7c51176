"""Pulling a Postgres sink table into Arrow: one REPEATABLE READ snapshot, COPY BINARY via ADBC.

Rows are read with the ADBC PostgreSQL driver, which runs ``COPY (SELECT ...)
TO STDOUT (FORMAT BINARY)`` and decodes it into Arrow record batches in C++:
no Python object per value (a probe of psycopg's tuples was about twice as
slow). The snapshot is REPEATABLE READ and also reads the sink's newest marker,
so the rows pulled and the epoch they stand for are one consistent view.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

from reconcile.core.checksum import checksum_kind
from reconcile.core.contract import ConfigurationError, InvalidInputError, RetryableError
from reconcile.core.target import KeyRange, Progress
from sinks.objects.declared import CREATE_EPOCH_INDEX, epoch_index_name

from .bucket_sums import PgBucketSums
from .connection import PgTarget
from .heavy import DEFAULT_STATEMENT_TIMEOUT_MS, Cancellable, hand_over, settings_sql
from .markers import MARKERS_TABLE
from .provenance import STAGED_KEYS, row_writers, stage_keys
from .pull_columns import select_list, sink_columns
from .ranges import (
    Params,
    RangeOrder,
    leading_index_collations,
    pieces_of,
    range_order,
    ranges_sql,
)
from .schema import EPOCH_COLUMN, TableSchema

__all__ = ["MarkerSource", "PgSnapshot"]

log = logging.getLogger("reconcile.recovery")

# What pg_export_snapshot() returns: hex words joined by dashes.
_SNAPSHOT_ID = re.compile(r"[0-9A-Fa-f]+(-[0-9A-Fa-f]+){1,3}")


@dataclass(frozen=True, slots=True)
class MarkerSource:
    """Whose markers a snapshot reads its newest epoch from.

    Attributes:
        schema: the schema of ``reconcile_commits`` (None: no markers yet).
        pipeline: whose markers to read.
        sink: the sink's name in the markers.
    """

    schema: str | None
    pipeline: str
    sink: str


def _adbc_error(target: PgTarget, err: Exception, what: str) -> Exception:
    text = target.redact(f"{what} on {target.describe()}: {err}").strip()
    if "Failed to connect" in str(err) or "connection" in str(err).lower():
        return RetryableError(text)
    return ConfigurationError(text)


class PgSnapshot:
    """A REPEATABLE READ snapshot of one sink table (the protocol ``SinkSnapshot``).

    Every session it opens is a heavy session (``heavy.py``): JIT off, a
    statement timeout, client checks; its statements run so that interrupting
    the client cancels them on the server.

    Args:
        target: where to connect.
        table: the reflected target.
        schema: the expected state's user schema (the columns pulled, in order).
        keys: the key columns.
        markers: whose markers give the snapshot's newest epoch.
        shared: a snapshot another session exported (``export()``): this one
            sees exactly what that one sees (parallel pulls of one state).
        application_name: the pull session's name in ``pg_stat_activity``
            (default: the DSN's).
        statement_timeout_ms: the sessions' statement timeout; None: the
            server's (database's, role's) non-zero setting, else 15 min.
    """

    def __init__(
        self,
        target: PgTarget,
        table: TableSchema,
        schema: pa.Schema,
        keys: list[str],
        markers: MarkerSource,
        *,
        shared: str | None = None,
        application_name: str | None = None,
        statement_timeout_ms: int | None = None,
    ) -> None:
        if shared is not None and not _SNAPSHOT_ID.fullmatch(shared):
            raise InvalidInputError(f"not an exported snapshot id: {shared!r}")
        self.target, self.table, self.schema, self.keys = target, table, schema, keys
        self.markers = markers
        self.shared = shared
        self.application_name = application_name
        self.statement_timeout_ms = statement_timeout_ms
        self.newest_epoch: int | None = None
        self.warnings: list[str] = []
        self._conn: Any = None
        self._statements = Cancellable(f"the pull from {table.display}")
        self._checksums = PgBucketSums(self)
        self.columns = sink_columns(table)
        self._order: RangeOrder | None = None

    # -- the session --------------------------------------------------------

    def session_settings(self) -> str:
        """The statement that makes a session of this snapshot a heavy session."""
        fallback = {"statement_timeout": DEFAULT_STATEMENT_TIMEOUT_MS}
        return settings_sql({"statement_timeout": self.statement_timeout_ms}, fallback)

    @contextmanager
    def opened(self) -> Iterator[PgSnapshot]:
        """Connect, begin the REPEATABLE READ transaction, read the newest marker."""
        import adbc_driver_manager
        import adbc_driver_postgresql.dbapi as adbc

        try:
            named = (
                {} if self.application_name is None else {"application_name": self.application_name}
            )
            self._conn = adbc.connect(self.target.conninfo(**named))
        except adbc_driver_manager.Error as err:
            raise _adbc_error(self.target, err, "pull: cannot connect") from None
        try:
            # The first statement of the transaction fixes its snapshot: every
            # pull, checksum and the marker below see the same committed state.
            self.run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            if self.shared is not None:
                # Before any query of the transaction: the exported snapshot becomes
                # ours (the id was checked against its format; it cannot be a parameter).
                self.run(f"SET TRANSACTION SNAPSHOT '{self.shared}'")
            # pg_catalog only: every name below is qualified, and the staged keys
            # live in pg_temp, which is then searched first for unqualified names
            # (the driver's own COPY into them), never a schema a role could plant.
            self.run("SET LOCAL search_path = pg_catalog")
            self.run(self.session_settings()).fetchall()
            self.newest_epoch = self._newest_marker()
            yield self
        except adbc_driver_manager.Error as err:
            raise _adbc_error(self.target, err, f"pull from {self.table.display}") from None
        finally:
            self._checksums.close()
            if self._statements.stuck:
                # A statement still runs in its worker: closing the connection
                # under it is unsafe; the server ends it (client checks, timeout).
                self._conn = None
            else:
                try:
                    # Read only: a session that is gone (terminated, server restarted)
                    # has nothing to roll back, and its error must not hide the one
                    # that ended the block.
                    with suppress(adbc_driver_manager.Error):
                        self._conn.rollback()
                finally:
                    with suppress(adbc_driver_manager.Error):
                        self._conn.close()
                    self._conn = None

    def export(self) -> str:
        """This snapshot's id, for other sessions to share it while this one stays open."""
        row = self.run("SELECT pg_catalog.pg_export_snapshot()").fetchone()
        return str(row[0])

    def run(self, query: str, parameters: Any = None) -> Any:
        """Execute one statement (cancelled on the server if the client is interrupted)."""
        cur = self._conn.cursor()
        bound = _adbc_params(parameters)
        self._statements.run(lambda: cur.execute(query, parameters=bound), cur.adbc_cancel)
        return cur

    def rows(self, query: str, parameters: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Execute one query and read its (few) rows."""
        rows: list[tuple[Any, ...]] = self.run(query, parameters).fetchall()
        return rows

    def _text(self, composed: sql.Composable) -> str:
        return composed.as_string(None)

    def _newest_marker(self) -> int | None:
        markers = self.markers
        if markers.schema is None:
            return None
        query = sql.SQL("SELECT max(epoch) FROM {} WHERE pipeline = $1 AND sink = $2").format(
            sql.Identifier(markers.schema, MARKERS_TABLE)
        )
        row = self.run(self._text(query), (markers.pipeline, markers.sink)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    # -- what is selected ---------------------------------------------------

    def _select_list(self) -> sql.Composable:
        return select_list(self.schema, self.columns)

    def _fetch(self, query: sql.Composable, parameters: Any = None,
               progress: Progress | None = None, total: int | None = None) -> pa.Table:  # fmt: skip
        batches: list[pa.RecordBatch] = []
        schema = self._stream(query, batches.append, parameters, progress, total)
        return pa.Table.from_batches(batches, schema=schema)

    def _stream(self, query: sql.Composable, each: Callable[[pa.RecordBatch], None],
                parameters: Any = None, progress: Progress | None = None,
                total: int | None = None) -> pa.Schema:  # fmt: skip
        """Run one query, handing its rows to ``each`` a record batch at a time; its schema."""
        cur = self._conn.cursor()
        text = self._text(query)
        bound = _adbc_params(parameters)

        def read() -> pa.Schema:
            cur.execute(text, parameters=bound)
            reader = cur.fetch_record_batch()
            rows = 0

            def counted(batch: pa.RecordBatch) -> None:
                nonlocal rows
                each(batch)
                rows += batch.num_rows
                if progress is not None:
                    progress(rows, total)

            hand_over(reader, counted)
            return reader.schema

        schema: pa.Schema = self._statements.run(read, cur.adbc_cancel)
        return schema

    # -- the pulls ------------------------------------------------------------

    def estimated_rows(self) -> int | None:
        row = self.run(
            "SELECT reltuples::bigint FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
            (self.table.schema, self.table.table),
        ).fetchone()
        return None if row is None or row[0] is None or row[0] < 0 else int(row[0])

    def count_rows(self) -> int:
        """The rows the table holds in this snapshot (for the mass-change brake)."""
        query = sql.SQL("SELECT count(*) FROM {}").format(self.table.ident)
        row = self.run(self._text(query)).fetchone()
        return int(row[0])

    def pull_all(self, progress: Progress | None) -> pa.Table:
        """Every row of the table (full mode)."""
        total = self.estimated_rows() if progress is not None else None
        query = sql.SQL("SELECT {} FROM {} AS t").format(self._select_list(), self.table.ident)
        return self._fetch(query, progress=progress, total=total)

    def pull_each(self, each: Callable[[pa.Table], None], progress: Progress | None) -> None:
        """Every row of the table, handed to ``each`` a record batch at a time.

        One COPY, as ``pull_all``, read as the driver decodes it: the client
        holds one batch (the driver's, about 16 MiB), not the table.
        """
        total = self.estimated_rows() if progress is not None else None
        query = sql.SQL("SELECT {} FROM {} AS t").format(self._select_list(), self.table.ident)
        self._stream(query, lambda batch: each(pa.Table.from_batches([batch])), None, progress,
                     total)  # fmt: skip

    def pull_keys(self, keys: pa.Table, newer_than: int) -> pa.Table:
        """Rows of the staged keys, plus rows whose ``_epoch`` is newer (scoped mode).

        The keys are COPied into a temp table and joined through the key's
        index; a UNION (not an OR, which the planner would answer with a full
        scan) adds the rows of later epochs, through an index on ``_epoch``
        where there is one (without it, that arm scans the table: a warning).
        """
        if EPOCH_COLUMN not in self.table.columns:
            raise InvalidInputError(
                f"table {self.table.display} has no {EPOCH_COLUMN} column, which scoped mode "
                "needs; use mode full or buckets",
                table=self.table.display,
            )
        if not leading_index_collations(
            self.rows, self.table.schema, self.table.table, EPOCH_COLUMN
        ):
            # The statement create_epoch_column=True would run: one name for it.
            create = sql.SQL(CREATE_EPOCH_INDEX).format(
                index=sql.Identifier(epoch_index_name(self.table.table)),
                target=self.table.ident,
                column=sql.Identifier(EPOCH_COLUMN),
            )
            self._warn(
                f"table {self.table.display} has no index on {EPOCH_COLUMN}: scoped mode reads "
                f"every row to find the later epochs' rows; create one with: "
                f"{self._text(create)}"
            )
        match = stage_keys(self, keys)
        query = sql.SQL(
            "SELECT {cols} FROM {table} AS t JOIN {keys} AS k ON {match} "
            "UNION SELECT {cols} FROM {table} AS t WHERE t.{epoch} > $1"
        ).format(
            cols=self._select_list(),
            table=self.table.ident,
            keys=sql.Identifier("pg_temp", STAGED_KEYS),
            match=match,
            epoch=sql.Identifier(EPOCH_COLUMN),
        )
        return self._fetch(query, (newer_than,))

    def row_writers(self, keys: pa.Table) -> tuple[pa.Table | None, bool, str]:
        """The rows of ``keys`` with their last writing transaction (``provenance.py``)."""
        return row_writers(self, keys)

    def _warn(self, text: str) -> None:
        log.warning("%s", text)
        self.warnings.append(text)

    # -- key ranges -----------------------------------------------------------

    def range_order(self) -> RangeOrder:
        """How the first key column compares with range bounds (read once from the catalog)."""
        if self._order is None:
            first = self.columns[self.keys[0]]
            self._order = range_order(
                self.rows, self.table.schema, self.table.table, first.name, first.kind,
                first.sql_type,
            )  # fmt: skip
        return self._order

    @property
    def narrow_ranges(self) -> bool:
        """An index reads a key range's rows (else every range query scans the table)."""
        return self.range_order().indexed

    def check_buckets(self) -> None:
        """Refuse buckets mode where its checksums cannot match (``PgBucketSums.check``)."""
        self._checksums.check()

    def checksum_columns(self) -> list[tuple[str, str]]:
        """(column, checksum kind) of every pulled column; raises for one not checksummed."""
        out = []
        for field in self.schema:
            kind = self.columns[field.name].kind
            checksum_kind(field.name, kind)
            out.append((field.name, kind))
        return out

    def bucket_sums(
        self, bounds: list[Any], within: Sequence[KeyRange]
    ) -> dict[int, tuple[int, int]]:
        """Per-bucket (count, checksum) computed by the database from the values."""
        return self._checksums.bucket_sums(bounds, within)

    def range_bounds(self, parts: int) -> list[Any]:
        """Values that cut the table into ``parts`` of about equal rows (``PgBucketSums``)."""
        return self._checksums.range_bounds(parts)

    def pull_ranges(self, ranges: Sequence[KeyRange]) -> pa.Table:
        """The rows of some key ranges (the differing buckets), in one query.

        The ranges are array parameters (``ranges.py``): the query's text is
        the same for one range and for thousands.
        """
        if not ranges:
            nothing = sql.SQL("SELECT {} FROM {} AS t WHERE false")
            return self._fetch(nothing.format(self._select_list(), self.table.ident))
        params = Params()
        query = ranges_sql(
            self.range_order(), self.table.ident, self._select_list(),
            pieces_of(ranges, [1] * len(ranges)), params, tagged=False,
        )  # fmt: skip
        return self._fetch(query, params.values)


def _adbc_params(parameters: Any) -> Any:
    """Parameters as ADBC binds them; lists become text arrays (typed even when empty)."""
    if parameters is None or not any(isinstance(p, list) for p in parameters):
        return parameters
    columns = [
        pa.array([p], pa.list_(pa.string())) if isinstance(p, list) else pa.array([p])
        for p in parameters
    ]
    return pa.record_batch(columns, names=[f"p{i}" for i in range(len(columns))])
