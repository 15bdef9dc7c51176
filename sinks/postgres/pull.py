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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

from reconcile.checksum import checksum_kind, row_checksum_sql, server_check_sql
from reconcile.contract import ConfigurationError, InvalidInputError, RetryableError
from reconcile.recovery.conform import SinkColumn, wants_text
from reconcile.recovery.target import KeyRange, Progress

from .connection import PgTarget
from .markers import MARKERS_TABLE
from .schema import EPOCH_COLUMN, TableSchema

__all__ = ["PgSnapshot", "sink_columns"]

log = logging.getLogger("reconcile.recovery")

_KINDS = {
    "int2": "int",
    "int4": "int",
    "int8": "int",
    "numeric": "numeric",
    "float8": "float8",
    "float4": "float4",
    "bool": "bool",
    "text": "text",
    "varchar": "text",
    "uuid": "uuid",
    "date": "date",
    "timestamp": "timestamp",
    "timestamptz": "timestamptz",
    "bytea": "bytes",
}
# First key column kinds whose order is the same in PostgreSQL (text under
# COLLATE "C") and in Arrow, so that key ranges mean the same on both sides.
_RANGE_KINDS = ("int", "numeric", "text", "uuid", "date", "timestamp", "timestamptz")
_BATCH_ROWS = 1 << 16
# What pg_export_snapshot() returns: hex words joined by dashes.
_SNAPSHOT_ID = re.compile(r"[0-9A-Fa-f]+(-[0-9A-Fa-f]+){1,3}")


def sink_columns(table: TableSchema) -> dict[str, SinkColumn]:
    """The target's columns as recovery sees them (kind by pg_type.typname)."""
    return {
        name: SinkColumn(name, _KINDS.get(col.typname, "other"), col.sql_type)
        for name, col in table.columns.items()
    }


def _adbc_error(target: PgTarget, err: Exception, what: str) -> Exception:
    text = target.redact(f"{what} on {target.describe()}: {err}").strip()
    if "Failed to connect" in str(err) or "connection" in str(err).lower():
        return RetryableError(text)
    return ConfigurationError(text)


class PgSnapshot:
    """A REPEATABLE READ snapshot of one sink table (the protocol ``SinkSnapshot``).

    Args:
        target: where to connect.
        table: the reflected target.
        schema: the expected state's user schema (the columns pulled, in order).
        keys: the key columns.
        marker_schema: the schema of ``reconcile_commits`` (None: no markers yet).
        pipeline: whose markers to read.
        sink: the sink's name in the markers.
        shared: a snapshot another session exported (``export()``): this one
            sees exactly what that one sees (parallel pulls of one state).
        application_name: the pull session's name in ``pg_stat_activity``
            (default: the DSN's).
    """

    def __init__(
        self,
        target: PgTarget,
        table: TableSchema,
        schema: pa.Schema,
        keys: list[str],
        marker_schema: str | None,
        pipeline: str,
        sink: str,
        shared: str | None = None,
        application_name: str | None = None,
    ) -> None:
        if shared is not None and not _SNAPSHOT_ID.fullmatch(shared):
            raise InvalidInputError(f"not an exported snapshot id: {shared!r}")
        self.target, self.table, self.schema, self.keys = target, table, schema, keys
        self.marker_schema, self.pipeline, self.sink = marker_schema, pipeline, sink
        self.shared = shared
        self.application_name = application_name
        self.newest_epoch: int | None = None
        self._conn: Any = None
        self._sums: psycopg.Connection[Any] | None = None
        self._columns = sink_columns(table)

    # -- the session --------------------------------------------------------

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
            self._run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            if self.shared is not None:
                # Before any query of the transaction: the exported snapshot becomes
                # ours (the id was checked against its format; it cannot be a parameter).
                self._run(f"SET TRANSACTION SNAPSHOT '{self.shared}'")
            # pg_catalog only: every name below is qualified, and the staged keys
            # live in pg_temp, which is then searched first for unqualified names
            # (the driver's own COPY into them), never a schema a role could plant.
            self._run("SET LOCAL search_path = pg_catalog")
            self.newest_epoch = self._newest_marker()
            yield self
        except adbc_driver_manager.Error as err:
            raise _adbc_error(self.target, err, f"pull from {self.table.display}") from None
        finally:
            try:
                if self._sums is not None:
                    self._sums.close()
                    self._sums = None
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
        row = self._run("SELECT pg_catalog.pg_export_snapshot()").fetchone()
        return str(row[0])

    def _run(self, query: str, parameters: Any = None) -> Any:
        cur = self._conn.cursor()
        cur.execute(query, parameters=parameters)
        return cur

    def _text(self, composed: sql.Composable) -> str:
        return composed.as_string(None)

    def _newest_marker(self) -> int | None:
        if self.marker_schema is None:
            return None
        query = sql.SQL("SELECT max(epoch) FROM {} WHERE pipeline = $1 AND sink = $2").format(
            sql.Identifier(self.marker_schema, MARKERS_TABLE)
        )
        row = self._run(self._text(query), (self.pipeline, self.sink)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    # -- what is selected ---------------------------------------------------

    def _select_list(self) -> sql.Composable:
        parts: list[sql.Composable] = []
        for field in self.schema:
            column = self._columns[field.name]
            ident = sql.Identifier("t", field.name)
            if wants_text(column.kind, field.type):
                parts.append(sql.SQL("{}::text AS {}").format(ident, sql.Identifier(field.name)))
            elif column.kind == "uuid":  # a 16-byte binary in the expected state
                parts.append(
                    sql.SQL("pg_catalog.uuid_send({}) AS {}").format(
                        ident, sql.Identifier(field.name)
                    )
                )
            else:
                parts.append(ident)
        return sql.SQL(", ").join(parts)

    def _fetch(self, query: sql.Composable, parameters: Any = None,
               progress: Progress | None = None, total: int | None = None) -> pa.Table:  # fmt: skip
        cur = self._run(self._text(query), parameters)
        reader = cur.fetch_record_batch()
        batches = []
        rows = 0
        for batch in reader:
            batches.append(batch)
            rows += batch.num_rows
            if progress is not None:
                progress(rows, total)
        if not batches:
            return reader.schema.empty_table()
        return pa.Table.from_batches(batches, schema=reader.schema)

    # -- the pulls ------------------------------------------------------------

    def estimated_rows(self) -> int | None:
        row = self._run(
            "SELECT reltuples::bigint FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
            (self.table.schema, self.table.table),
        ).fetchone()
        return None if row is None or row[0] is None or row[0] < 0 else int(row[0])

    def count_rows(self) -> int:
        """The rows the table holds in this snapshot (for the mass-change brake)."""
        query = sql.SQL("SELECT count(*) FROM {}").format(self.table.ident)
        row = self._run(self._text(query)).fetchone()
        return int(row[0])

    def pull_all(self, progress: Progress | None) -> pa.Table:
        """Every row of the table (full mode)."""
        total = self.estimated_rows() if progress is not None else None
        query = sql.SQL("SELECT {} FROM {} AS t").format(self._select_list(), self.table.ident)
        return self._fetch(query, progress=progress, total=total)

    def pull_keys(self, keys: pa.Table, newer_than: int) -> pa.Table:
        """Rows of the staged keys, plus rows whose ``_epoch`` is newer (scoped mode).

        The keys are COPied into a temp table and joined through the key's
        index; a UNION (not an OR, which the planner would answer with a full
        scan) adds the rows of later epochs.
        """
        if EPOCH_COLUMN not in self.table.columns:
            raise InvalidInputError(
                f"table {self.table.display} has no {EPOCH_COLUMN} column, which scoped mode "
                "needs; use mode full or buckets",
                table=self.table.display,
            )
        name = "_reconcile_scope_keys"
        cur = self._conn.cursor()
        staged = keys.select(self.keys)
        cur.adbc_ingest(name, staged, mode="replace", temporary=True)
        self._run(f"ANALYZE pg_temp.{name}")
        # The staged keys have the expected state's types (a uuid kept as text,
        # say): cast them to the column's own type, so the key's index serves.
        match = sql.SQL(" AND ").join(
            sql.SQL("t.{0} = k.{0}::{1}").format(
                sql.Identifier(k), sql.SQL(self.table.columns[k].sql_type)
            )
            for k in self.keys
        )
        query = sql.SQL(
            "SELECT {cols} FROM {table} AS t JOIN {keys} AS k ON {match} "
            "UNION SELECT {cols} FROM {table} AS t WHERE t.{epoch} > $1"
        ).format(
            cols=self._select_list(),
            table=self.table.ident,
            keys=sql.Identifier("pg_temp", name),
            match=match,
            epoch=sql.Identifier(EPOCH_COLUMN),
        )
        return self._fetch(query, (newer_than,))

    # -- buckets --------------------------------------------------------------

    def check_buckets(self) -> None:
        """Refuse buckets mode where its checksums cannot match this module's.

        Raises:
            InvalidInputError: a type that is not checksummed, a first key column
                whose order differs between the two sides, a database not in
                UTF8, or a server whose hashtextextended differs (big-endian).
        """
        first = self._columns[self.keys[0]]
        if first.kind not in _RANGE_KINDS:
            raise InvalidInputError(
                f"table {self.table.display}: buckets mode splits by the first key column "
                f"{first.name!r}, whose type {first.sql_type} it cannot range over; use mode "
                "full or scoped",
                column=first.name,
            )
        self._checksum_columns()  # raises for a type that is not checksummed
        row = self._run("SELECT pg_catalog.current_setting('server_encoding')").fetchone()
        if row is None or row[0] != "UTF8":
            raise InvalidInputError(
                f"table {self.table.display}: buckets mode needs a UTF8 database (this one is "
                f"{row[0] if row else '?'}); use mode full or scoped"
            )
        query, want = server_check_sql()
        got = self._run(query).fetchone()
        if list(got or []) != [v for _, v in want]:
            raise InvalidInputError(
                f"table {self.table.display}: this server's hashtextextended() gives other "
                "values than reconcile.checksum (a big-endian server?); use mode full or scoped"
            )

    def _checksum_columns(self) -> list[tuple[str, str]]:
        out = []
        for field in self.schema:
            kind = self._columns[field.name].kind
            checksum_kind(field.name, kind)
            out.append((field.name, kind))
        return out

    def _range_sql(self, within: KeyRange, first: int) -> tuple[sql.Composable, list[Any]]:
        """WHERE conditions for a key range, with its parameters numbered from ``first``."""
        key = self._key_expr()
        conditions: list[sql.Composable] = []
        params: list[Any] = []
        cast = sql.SQL(self.table.columns[self.keys[0]].sql_type)
        for bound, op in ((within.lo, ">="), (within.hi, "<")):
            if bound is not None:
                conditions.append(
                    sql.SQL("{} " + op + " ${}::text::{}").format(
                        key, sql.SQL(str(first + len(params))), cast
                    )
                )
                params.append(_literal(bound))
        where = sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("true")
        return where, params

    def _key_expr(self) -> sql.Composable:
        first = self._columns[self.keys[0]]
        ident = sql.Identifier("t", self.keys[0])
        # Byte order for text: the order Arrow sorts in, whatever the database's collation.
        return sql.SQL('{} COLLATE "C"').format(ident) if first.kind == "text" else ident

    def _sums_session(self) -> psycopg.Connection[Any]:
        """A second session on this very snapshot, for the checksum queries.

        The driver reads every result through COPY, which PostgreSQL runs
        without parallel workers; a plain SELECT on a session that imported
        the snapshot (``SET TRANSACTION SNAPSHOT``) sees the same rows and may
        use them (measured: about 1.7x faster on 2 cores).
        """
        if self._sums is None:
            shared = self.export()
            conn = self.target.connect(application_name="reconcile-verify")
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(shared)))
            conn.execute("SET LOCAL search_path = pg_catalog")
            self._sums = conn
        return self._sums

    def _ranges_sql(
        self, ranges: Sequence[KeyRange], first: int
    ) -> tuple[sql.Composable, list[Any], bool]:
        """WHERE conditions for any of ``ranges``; parameters numbered from ``first``.

        Returns the condition, its parameters, and whether it is the whole table.
        """
        if not ranges:
            return sql.SQL("false"), [], False
        if any(r.lo is None and r.hi is None for r in ranges):
            return sql.SQL("true"), [], True
        parts: list[sql.Composable] = []
        params: list[Any] = []
        for within in ranges:
            where, more = self._range_sql(within, first + len(params))
            parts.append(sql.SQL("({})").format(where))
            params += more
        return sql.SQL(" OR ").join(parts), params, False

    def bucket_sums(
        self, bounds: list[Any], within: Sequence[KeyRange]
    ) -> dict[int, tuple[int, int]]:
        """Per-bucket (count, checksum) computed by the database from the values."""
        cast = sql.SQL(self.table.columns[self.keys[0]].sql_type)
        where, params, wide = self._ranges_sql(within, 2)
        query = sql.SQL(
            "SELECT pg_catalog.width_bucket({key}, $1::text[]::{cast}[]) AS b, count(*), "
            "(pg_catalog.sum({checksum}) % 18446744073709551616)::text "
            "FROM {table} AS t WHERE {where} GROUP BY 1"
        ).format(
            key=self._key_expr(),
            cast=cast,
            checksum=row_checksum_sql(self._checksum_columns(), alias="t"),
            table=self.table.ident,
            where=where,
        )
        # The driver's $n placeholders, as psycopg's %s (no other % in the query).
        text = re.sub(r"\$\d+", "%s", self._text(query).replace("%", "%%"))
        session = self._sums_session()
        if wide:
            # The planner guesses one group per row for width_bucket (it has no
            # statistics on the expression), so it judges partial aggregation in
            # parallel workers not worth it and scans the whole table in one
            # process. The groups are at most len(bounds) + 1: costing the workers'
            # tuples at nothing lets it choose them (measured: 2x on 2 cores).
            # SET LOCAL: this read-only transaction only.
            session.execute("SET LOCAL parallel_setup_cost = 0")
            session.execute("SET LOCAL parallel_tuple_cost = 0")
        rows = session.execute(text, [[_literal(b) for b in bounds], *params]).fetchall()
        if wide:
            # Narrow ranges are index scans: leave their plans to the defaults.
            session.execute("SET LOCAL parallel_setup_cost TO DEFAULT")
            session.execute("SET LOCAL parallel_tuple_cost TO DEFAULT")
        return {int(b): (int(n), int(s) % (1 << 64)) for b, n, s in rows}

    def range_bounds(self, parts: int) -> list[Any]:
        """Values of the first key column that cut the table into ``parts`` of about equal rows.

        At most ``parts - 1`` distinct values, ascending in the order the ranges
        use (``COLLATE "C"`` for text), from one ``percentile_disc`` pass over
        the key (an index-only scan where the key is indexed).

        Raises:
            InvalidInputError: the first key column's type cannot be cut into ranges.
        """
        kind = self._columns[self.keys[0]].kind
        if kind not in _RANGE_KINDS:
            raise InvalidInputError(
                f"table {self.table.display}: its first key column {self.keys[0]!r} is of "
                f"kind {kind!r}, which cannot be cut into key ranges; verify it in-process"
            )
        if parts <= 1:
            return []
        fractions = ", ".join(repr(i / parts) for i in range(1, parts))
        query = sql.SQL(
            "SELECT pg_catalog.percentile_disc(ARRAY[{}]::float8[]) WITHIN GROUP (ORDER BY {}) "
            "FROM {} AS t"
        ).format(sql.SQL(fractions), self._key_expr(), self.table.ident)
        row = self._run(self._text(query)).fetchone()
        values = [] if row is None or row[0] is None else list(row[0])
        bounds: list[Any] = []
        for value in values:
            if value is not None and (not bounds or value != bounds[-1]):
                bounds.append(value)
        return bounds

    def pull_ranges(self, ranges: Sequence[KeyRange]) -> pa.Table:
        """The rows of some key ranges (the differing buckets), in one query."""
        where, params, _ = self._ranges_sql(ranges, 1)
        query = sql.SQL("SELECT {} FROM {} AS t WHERE {}").format(
            self._select_list(), self.table.ident, where
        )
        return self._fetch(query, params or None)


def _literal(value: Any) -> str:
    """A key value as the text PostgreSQL parses back into the column's type."""
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    if isinstance(value, bytes):
        return value.hex()
    return str(value)
