"""Applying a validated batch inside the epoch txn: COPY into temp tables, or unnest() arrays.

Both paths send the epoch in bounded chunks, so that neither the client's
memory nor any one protocol message grows with the epoch: Arrow data is turned
into CSV one slice at a time for COPY, and prepared mode sends several bounded
``INSERT ... SELECT FROM unnest(...)`` statements inside the same transaction.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
import pyarrow.csv as pacsv  # type: ignore[import-untyped, unused-ignore]
from psycopg import errors, sql

from reconcile.core import hooks
from reconcile.core.contract import RetryableError
from sinks.objects.stages import create_session_stage, session_stage

from .arrow_batch import arrow_row_bytes
from .schema import EPOCH_COLUMN, TableSchema, direct_copy_blockers
from .staging import ValidatedBatch

__all__ = [
    "ARRAY_CHUNK",
    "COPY_CHUNK",
    "ChunkLimits",
    "DirectCopyRaced",
    "apply_with_arrays",
    "apply_with_copy",
]

log = logging.getLogger("reconcile.sinks.postgres")

# Between reading the catalog facts that allow the direct COPY and the COPY
# itself: the table lock must keep any DDL out of this window.
DIRECT_COPY_CHECKED = hooks.declare("pg.apply.direct_copy_checked")
# Between the probe that found the key range free and the direct COPY: a
# concurrent writer may insert a key of the range here.
DIRECT_COPY_PROBED = hooks.declare("pg.apply.direct_copy_probed")


class DirectCopyRaced(RetryableError):
    """The direct COPY met a key another transaction wrote after the probe: retry the epoch."""


@dataclass(frozen=True)
class ChunkLimits:
    """At most this many rows, and about this many bytes, in one chunk (at least one row)."""

    rows: int
    bytes: int


# One CSV slice for COPY: what the client holds at once besides the epoch's own
# Arrow data.
COPY_CHUNK = ChunkLimits(rows=65_536, bytes=8 << 20)
# One unnest() statement of prepared mode: one bind message, far below
# PostgreSQL's 1 GB message limit even with a maximal row (staging.py refuses
# rows above values.MAX_ROW_BYTES).
ARRAY_CHUNK = ChunkLimits(rows=50_000, bytes=32 << 20)
# Below this many Arrow rows the key-range probe is not worth a round trip.
_DIRECT_MIN_ROWS = 10_000


def _chunks(
    sizes: np.ndarray[Any, np.dtype[np.int64]] | None, count: int, limits: ChunkLimits
) -> Iterator[tuple[int, int]]:
    """[start, stop) ranges over ``count`` rows within ``limits``; ``sizes``: bytes a row."""
    if sizes is None:
        for start in range(0, count, limits.rows):
            yield start, min(count, start + limits.rows)
        return
    ends = np.cumsum(sizes)
    start = 0
    while start < count:
        base = int(ends[start - 1]) if start else 0
        by_bytes = int(np.searchsorted(ends, base + limits.bytes, side="right"))
        stop = min(count, start + limits.rows, max(by_bytes, start + 1))
        yield start, stop
        start = stop


def _table_chunks(table: pa.Table, limits: ChunkLimits) -> Iterator[pa.Table]:
    """Zero-copy slices of ``table`` within ``limits``.

    Row sizes are measured one block of ``limits.rows`` rows at a time, and
    only for a block over the byte limit, so this costs memory in proportion
    to a block, not to the table.
    """
    for start in range(0, table.num_rows, limits.rows):
        block = table.slice(start, limits.rows)
        if block.nbytes <= limits.bytes:
            yield block
            continue
        for first, stop in _chunks(arrow_row_bytes(block), block.num_rows, limits):
            yield block.slice(first, stop - first)


def _upsert_tail(schema: TableSchema, columns: tuple[str, ...], append_only: bool) -> sql.Composed:
    """The ON CONFLICT clause: DO NOTHING for append-only targets, else DO UPDATE."""
    conflict = sql.SQL(", ").join(map(sql.Identifier, schema.key))
    updated = [c for c in columns if c not in schema.key]
    if schema.has_epoch_column:
        updated.append(EPOCH_COLUMN)
    if append_only or not updated:
        return sql.SQL(" ON CONFLICT ({}) DO NOTHING").format(conflict)
    sets = sql.SQL(", ").join(
        sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updated
    )
    return sql.SQL(" ON CONFLICT ({}) DO UPDATE SET {}").format(conflict, sets)


def _target_columns(schema: TableSchema, columns: tuple[str, ...]) -> sql.Composed:
    names = list(columns) + ([EPOCH_COLUMN] if schema.has_epoch_column else [])
    return sql.SQL(", ").join(map(sql.Identifier, names))


def _select_list(schema: TableSchema, columns: tuple[str, ...], alias: str) -> sql.Composed:
    parts: list[sql.Composable] = [sql.Identifier(alias, c) for c in columns]
    if schema.has_epoch_column:
        parts.append(sql.SQL("%(epoch)s::bigint"))
    return sql.SQL(", ").join(parts)


def _copy_rows(
    cur: psycopg.Cursor[Any],
    name: sql.Identifier,
    schema: TableSchema,
    columns: tuple[str, ...],
    rows: list[tuple[Any, ...]],
) -> None:
    cols = [schema.columns[c] for c in columns]
    binary = all(c.kind != "other" for c in cols)
    fmt = sql.SQL("(FORMAT BINARY)" if binary else "(FORMAT TEXT)")
    query = sql.SQL("COPY {} ({}) FROM STDIN {}").format(
        name, sql.SQL(", ").join(map(sql.Identifier, columns)), fmt
    )
    with cur.copy(query) as copy:
        if binary:
            # Text types go as text (oid 25, its UTF-8 bytes), which bpcharrecv pads
            # as an INSERT would: psycopg has no binary dumper for bpchar or citext.
            copy.set_types([25 if c.kind == "text" else c.type_oid for c in cols])
        for row in rows:
            copy.write_row(row)


def write_csv(table: pa.Table, out: io.BytesIO, options: pacsv.WriteOptions) -> None:
    """Arrow's CSV writer over one chunk per column.

    pyarrow 26's writer emits garbage (NUL bytes, or other rows' bytes, which
    could be valid CSV) for a table whose columns have several chunks, the
    first one empty: what slicing and concatenating epochs makes. One
    contiguous chunk is written correctly; the copy is bounded by the slice.
    """
    pacsv.write_csv(table.combine_chunks(), out, options)


def _copy_arrow(cur: psycopg.Cursor[Any], name: sql.Composable, table: pa.Table) -> None:
    # CSV written by Arrow's C++ writer: no per-row Python. Strings are always
    # quoted, NULLs are empty and unquoted, which is exactly COPY CSV's NULL.
    # One bounded slice at a time: the CSV of the whole epoch is never held.
    query = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT CSV)").format(
        name, sql.SQL(", ").join(map(sql.Identifier, table.column_names))
    )
    options = pacsv.WriteOptions(include_header=False)
    buffer = io.BytesIO()
    with cur.copy(query) as copy:
        for part in _table_chunks(table, COPY_CHUNK):
            buffer.seek(0)
            buffer.truncate()
            write_csv(part, buffer, options)
            with buffer.getbuffer() as view:
                copy.write(view)


def apply_with_copy(
    cur: psycopg.Cursor[Any],
    schema: TableSchema,
    batch: ValidatedBatch,
    epoch: int,
    *,
    append_only: bool,
    direct_copy_triggers: bool = False,
) -> None:
    """COPY the batch into session temp tables, then upsert and delete in bulk.

    Fast path: a large Arrow batch whose integer key range holds no row of
    the target yet is COPied straight into the target, in the epoch's own
    transaction (no savepoint: every row it writes carries the transaction's
    xid, the one its marker records). If a key turns out to exist after all
    (a concurrent writer inserted it after the probe), the transaction is
    lost: ``DirectCopyRaced``, a RetryableError, and the epoch's retry takes
    the temp table + ON CONFLICT path, its probe seeing that row. It is
    taken only where it is equivalent to that path (see ``_direct_copy_ok``),
    so the same rows get the same outcome whatever the epoch's size.

    Args:
        cur: a cursor in the epoch txn.
        schema: the target.
        batch: the validated epoch.
        epoch: written into ``_epoch`` if the table has it.
        append_only: ON CONFLICT DO NOTHING instead of DO UPDATE.
        direct_copy_triggers: let the fast path run on a table with triggers
            (COPY fires its row and INSERT statement triggers, but not the
            UPDATE statement triggers of ON CONFLICT DO UPDATE).
    """
    if batch.delete_keys:
        # Deletes first: validation guarantees they share no key with upserts.
        stage = session_stage("d", schema, schema.key)
        create_session_stage(cur, stage, schema, schema.key)
        _copy_rows(cur, stage, schema, schema.key, batch.delete_keys)
        cur.execute(_delete_sql(schema, sql.SQL("{} AS d").format(stage)))
    if (
        not batch.rows
        and batch.arrow is not None
        and _direct_copy_ok(cur, schema, batch.arrow, direct_copy_triggers)
    ):
        direct = batch.arrow
        if schema.has_epoch_column:
            epochs = pa.array(np.full(direct.num_rows, epoch, dtype=np.int64))
            direct = direct.append_column(EPOCH_COLUMN, epochs)
        # No savepoint: rows written under one carry the subtransaction's xid,
        # which no marker or repair records, so provenance would call the
        # engine's own rows foreign. The rows are the epoch transaction's own.
        arbiters = _key_indexes(cur, schema)
        hooks.point(DIRECT_COPY_PROBED)
        try:
            _copy_arrow(cur, schema.ident, direct)
        except errors.UniqueViolation as err:
            if err.diag.constraint_name not in arbiters:
                # Another unique index: ON CONFLICT (key) does not cover it, so
                # the general path fails on it the same way (a rejection).
                raise
            # A key of the range exists after all: a concurrent writer inserted
            # it after the probe. The epoch's transaction is lost; its retry
            # probes again, sees that row, and takes the general path.
            raise DirectCopyRaced(
                f"table {schema.display}: a row with a key in the epoch's range "
                f"[{_bounds_text(direct, schema.key[0])}] was written by another "
                "transaction during the direct COPY (constraint "
                f"{err.diag.constraint_name}); nothing of the epoch was written; retry it",
                sqlstate=err.sqlstate,
            ) from None
        return
    if batch.rows or batch.arrow is not None:
        # A session's own temp table (pg_temp), ON COMMIT DELETE ROWS: one per
        # session serves every epoch without a catalog write, and a rolled-back
        # epoch leaves no rows in it either, so it is empty at every epoch's start.
        stage = session_stage("u", schema, batch.columns)
        create_session_stage(cur, stage, schema, batch.columns)
        if batch.rows:
            _copy_rows(cur, stage, schema, batch.columns, batch.rows)
        if batch.arrow is not None and batch.arrow.num_rows:
            _copy_arrow(cur, stage, batch.arrow)
        cur.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} AS s").format(
                schema.ident,
                _target_columns(schema, batch.columns),
                _select_list(schema, batch.columns, "s"),
                stage,
            )
            + _upsert_tail(schema, batch.columns, append_only),
            {"epoch": epoch},
        )


def _direct_copy_ok(
    cur: psycopg.Cursor[Any], schema: TableSchema, table: pa.Table, allow_triggers: bool
) -> bool:
    """True if COPY straight into the target is equivalent to the general path, and worth it.

    COPY ignores rules, writes identity columns without OVERRIDING SYSTEM
    VALUE, is refused under row security, and fires other triggers than
    INSERT ... ON CONFLICT. So it is taken only on a table with none of these
    (triggers if the user opted in), and only if no target row has a key in
    the batch's range (then no ON CONFLICT branch could have been taken).
    """
    if table.num_rows < _DIRECT_MIN_ROWS or len(schema.key) != 1:
        return False
    key = schema.key[0]
    if schema.columns[key].kind != "int" or not pa.types.is_integer(table.schema.field(key).type):
        return False  # the key-range probe below needs an integer key
    # Lock as the INSERT would (ROW EXCLUSIVE): from here until the txn ends no
    # DDL can add a rule, trigger, policy or identity, so the catalog read
    # below stays true for the COPY.
    cur.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(schema.ident))
    written = (*table.column_names, *([EPOCH_COLUMN] if schema.has_epoch_column else []))
    blockers = direct_copy_blockers(cur, schema, written, allow_triggers=allow_triggers)
    hooks.point(DIRECT_COPY_CHECKED)
    if blockers:
        log.debug(
            "table %s: no direct COPY (%s); using the temp table path",
            schema.display,
            ", ".join(blockers),
        )
        return False
    return _range_is_free(cur, schema, table)


def _key_indexes(cur: psycopg.Cursor[Any], schema: TableSchema) -> set[str]:
    """The unique indexes on exactly the key: the arbiters of ``ON CONFLICT (key)``.

    A partitioned table's included: a violation names the partition's index.
    """
    rows = cur.execute(
        "SELECT i.relname FROM pg_catalog.pg_index x "
        "JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid "
        "WHERE (x.indrelid = %(t)s::pg_catalog.regclass OR x.indrelid IN (SELECT p.relid "
        "FROM pg_catalog.pg_partition_tree(%(t)s::pg_catalog.regclass) p)) AND x.indisunique "
        "AND x.indpred IS NULL AND x.indexprs IS NULL AND x.indnkeyatts = 1 "
        "AND x.indkey[0] = (SELECT a.attnum FROM pg_catalog.pg_attribute a "
        "WHERE a.attrelid = x.indrelid AND a.attname = %(k)s)",
        {"t": schema.ident.as_string(cur), "k": schema.key[0]},
    ).fetchall()
    return {str(r[0]) for r in rows}


def _bounds_text(table: pa.Table, key: str) -> str:
    bounds = pc.min_max(table.column(key)).as_py()
    return f"{bounds['min']}, {bounds['max']}"


def _range_is_free(cur: psycopg.Cursor[Any], schema: TableSchema, table: pa.Table) -> bool:
    """True if no target row has a key within [min, max] of the batch's integer key."""
    if table.num_rows < _DIRECT_MIN_ROWS or len(schema.key) != 1:
        return False
    key = schema.key[0]
    if schema.columns[key].kind != "int" or not pa.types.is_integer(table.schema.field(key).type):
        return False
    bounds = pc.min_max(table.column(key)).as_py()
    row = cur.execute(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {} BETWEEN %s AND %s)").format(
            schema.ident, sql.Identifier(key)
        ),
        (bounds["min"], bounds["max"]),
    ).fetchone()
    return row is not None and not row[0]


def _delete_sql(schema: TableSchema, source: sql.Composable) -> sql.Composed:
    """DELETE the target rows whose key matches a row of ``source`` (aliased ``d``)."""
    match = sql.SQL(" AND ").join(
        sql.SQL("t.{0} = d.{0}").format(sql.Identifier(k)) for k in schema.key
    )
    return sql.SQL("DELETE FROM {} AS t USING {} WHERE {}").format(schema.ident, source, match)


def _unnest(schema: TableSchema, columns: tuple[str, ...], alias: str) -> sql.Composed:
    # Casts use format_type() text from the catalog, which the server already
    # quotes (quote_identifier) wherever a type name needs it. unnest is
    # qualified so that no function on the search_path can stand in for it;
    # ROWS FROM (...) is what the multi-argument unnest(a, b) stands for, and
    # that shorthand exists only for the unqualified name.
    arrays = sql.SQL(", ").join(
        sql.SQL("pg_catalog.unnest(%s::{}[])").format(sql.SQL(schema.columns[c].sql_type))
        for c in columns
    )
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    return sql.SQL("ROWS FROM ({}) AS {}({})").format(arrays, sql.Identifier(alias), names)


def apply_with_arrays(
    cur: psycopg.Cursor[Any],
    schema: TableSchema,
    batch: ValidatedBatch,
    epoch: int,
    *,
    append_only: bool,
) -> int:
    """Upsert and delete with unnest() statements of bounded size: no temp table.

    Prepared transactions cannot touch temporary tables, so prepared mode
    sends each column as an array parameter instead of COPY, in chunks of at
    most ``ARRAY_CHUNK`` (rows and bytes), all in the caller's transaction:
    one bind message never nears PostgreSQL's 1 GB limit, and the client holds
    the Python values of one chunk at a time, not of the whole epoch.

    Returns:
        The number of statements sent.
    """
    limits = ARRAY_CHUNK
    sent = 0
    upsert = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
        schema.ident,
        _target_columns(schema, batch.columns),
        sql.SQL(", ").join(
            [sql.Identifier("s", c) for c in batch.columns]
            + ([sql.SQL("%s::bigint")] if schema.has_epoch_column else [])
        ),
        _unnest(schema, batch.columns, "s"),
    ) + _upsert_tail(schema, batch.columns, append_only)
    head: list[Any] = [epoch] if schema.has_epoch_column else []
    rows = batch.rows
    known = rows and len(batch.row_bytes) == len(rows)
    sizes = np.asarray(batch.row_bytes, dtype=np.int64) if known else None
    for start, stop in _chunks(sizes, len(rows), limits):
        arrays = [list(col) for col in zip(*rows[start:stop], strict=True)]
        cur.execute(upsert, [*head, *arrays])
        sent += 1
    if batch.arrow is not None and batch.arrow.num_rows:
        for part in _table_chunks(batch.arrow, limits):
            cur.execute(upsert, [*head, *(column.to_pylist() for column in part.columns)])
            sent += 1
    keys = batch.delete_keys
    for start, stop in _chunks(None, len(keys), limits):
        # Key values are small (a btree entry is at most about 2.7 kB).
        arrays = [list(col) for col in zip(*keys[start:stop], strict=True)]
        cur.execute(_delete_sql(schema, _unnest(schema, schema.key, "d")), arrays)
        sent += 1
    return sent
