"""Applying a validated batch inside the epoch txn: COPY into temp tables, or unnest() arrays."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
import pyarrow.csv as pacsv  # type: ignore[import-untyped, unused-ignore]
from psycopg import errors, sql

from .schema import EPOCH_COLUMN, TableSchema
from .staging import ValidatedBatch

__all__ = ["apply_with_arrays", "apply_with_copy"]

_COPY_CHUNK = 1 << 20
# Below this many Arrow rows the key-range probe is not worth a round trip.
_DIRECT_MIN_ROWS = 10_000


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


def _stage_name(kind: str, schema: TableSchema, columns: tuple[str, ...]) -> sql.Identifier:
    """A per-session temp table name for (table, columns): reused by every epoch."""
    types = [f"{c}:{schema.columns[c].sql_type}" for c in columns]
    digest = hashlib.blake2b(
        "\x1f".join([schema.schema, schema.table, *types]).encode(), digest_size=8
    ).hexdigest()
    return sql.Identifier(f"_reconcile_{kind}_{digest}")


def _ensure_stage(
    cur: psycopg.Cursor[Any], name: sql.Identifier, schema: TableSchema, columns: tuple[str, ...]
) -> None:
    # CREATE ... AS SELECT ... WITH NO DATA copies the column types but no
    # constraints; ON COMMIT DELETE ROWS empties it at each commit, so one
    # table per session serves every epoch without a catalog write.
    cur.execute(
        sql.SQL(
            "CREATE TEMP TABLE IF NOT EXISTS {} ON COMMIT DELETE ROWS AS "
            "SELECT {} FROM {} WITH NO DATA"
        ).format(name, sql.SQL(", ").join(map(sql.Identifier, columns)), schema.ident)
    )
    # A rolled-back epoch leaves no rows behind either: they were inserted by
    # the rolled-back txn. So the table is empty at the start of every epoch.


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
            copy.set_types([c.type_oid for c in cols])
        for row in rows:
            copy.write_row(row)


def _copy_arrow(cur: psycopg.Cursor[Any], name: sql.Composable, table: pa.Table) -> None:
    # CSV written by Arrow's C++ writer: no per-row Python. Strings are always
    # quoted, NULLs are empty and unquoted, which is exactly COPY CSV's NULL.
    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer, pacsv.WriteOptions(include_header=False, batch_size=65536))
    view = buffer.getbuffer()
    query = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT CSV)").format(
        name, sql.SQL(", ").join(map(sql.Identifier, table.column_names))
    )
    with cur.copy(query) as copy:
        for start in range(0, len(view), _COPY_CHUNK):
            copy.write(view[start : start + _COPY_CHUNK])
    view.release()


def apply_with_copy(
    cur: psycopg.Cursor[Any],
    schema: TableSchema,
    batch: ValidatedBatch,
    epoch: int,
    *,
    append_only: bool,
) -> None:
    """COPY the batch into session temp tables, then upsert and delete in bulk.

    Fast path: a large Arrow batch whose integer key range holds no row of
    the target yet is COPied straight into the target, under a savepoint; if
    a key turns out to exist after all (a concurrent writer), the savepoint is
    rolled back and the batch takes the temp table + ON CONFLICT path.
    """
    if batch.delete_keys:
        # Deletes first: validation guarantees they share no key with upserts.
        stage = _stage_name("d", schema, schema.key)
        _ensure_stage(cur, stage, schema, schema.key)
        _copy_rows(cur, stage, schema, schema.key, batch.delete_keys)
        cur.execute(_delete_sql(schema, sql.SQL("{} AS d").format(stage)))
    if not batch.rows and batch.arrow is not None and _range_is_free(cur, schema, batch.arrow):
        direct = batch.arrow
        if schema.has_epoch_column:
            epochs = pa.array(np.full(direct.num_rows, epoch, dtype=np.int64))
            direct = direct.append_column(EPOCH_COLUMN, epochs)
        cur.execute("SAVEPOINT reconcile_direct_copy")
        try:
            _copy_arrow(cur, schema.ident, direct)
        except errors.UniqueViolation:
            cur.execute("ROLLBACK TO SAVEPOINT reconcile_direct_copy")
        else:
            cur.execute("RELEASE SAVEPOINT reconcile_direct_copy")
            return
    if batch.rows or batch.arrow is not None:
        stage = _stage_name("u", schema, batch.columns)
        _ensure_stage(cur, stage, schema, batch.columns)
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
    # quotes (quote_identifier) wherever a type name needs it.
    arrays = sql.SQL(", ").join(
        sql.SQL("%s::{}[]").format(sql.SQL(schema.columns[c].sql_type)) for c in columns
    )
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    return sql.SQL("unnest({}) AS {}({})").format(arrays, sql.Identifier(alias), names)


def apply_with_arrays(
    cur: psycopg.Cursor[Any],
    schema: TableSchema,
    batch: ValidatedBatch,
    epoch: int,
    *,
    append_only: bool,
) -> None:
    """Upsert and delete with one unnest() statement each: no temp table.

    Prepared transactions cannot touch temporary tables, so prepared mode
    sends each column as one array parameter instead of COPY.
    """
    if batch.rows or batch.arrow is not None:
        rows = list(batch.rows)
        if batch.arrow is not None:
            rows.extend(tuple(r.values()) for r in batch.arrow.to_pylist())
        arrays = [list(col) for col in zip(*rows, strict=True)] if rows else []
        if rows:
            query = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
                schema.ident,
                _target_columns(schema, batch.columns),
                sql.SQL(", ").join(
                    [sql.Identifier("s", c) for c in batch.columns]
                    + ([sql.SQL("%s::bigint")] if schema.has_epoch_column else [])
                ),
                _unnest(schema, batch.columns, "s"),
            ) + _upsert_tail(schema, batch.columns, append_only)
            params: list[Any] = [epoch] if schema.has_epoch_column else []
            cur.execute(query, [*params, *arrays])
    if batch.delete_keys:
        arrays = [list(col) for col in zip(*batch.delete_keys, strict=True)]
        cur.execute(_delete_sql(schema, _unnest(schema, schema.key, "d")), arrays)
