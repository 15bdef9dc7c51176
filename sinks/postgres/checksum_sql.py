"""Bucket checksums in SQL: the row text and its hash of ``reconcile.core.checksum``, on PostgreSQL.

``reconcile.core.checksum`` defines the canonical row text and checksum, and
computes them in numpy; the expressions here compute the same figures inside
the server, so that buckets mode pulls only the key ranges whose counts or
checksums differ. Pinned vectors are checked against a real server in
``tests/integration/test_checksum_pg.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from reconcile.core.checksum import SEED, checksum_kind, pg_hash_bytes, signed64

__all__ = ["row_checksum_sql", "row_text_sql", "server_check_sql"]

_SEND = {
    "float8": "float8send",
    "float4": "float4send",
    "date": "date_send",
    "timestamp": "timestamp_send",
    "timestamptz": "timestamptz_send",
}


def _field_sql(column: str, kind: str, alias: str | None) -> sql.Composable:
    c = sql.Identifier(alias, column) if alias else sql.Identifier(column)
    kind = checksum_kind(column, kind)
    if kind in ("int", "bool", "uuid"):
        return sql.SQL("{}::text").format(c)
    if kind == "numeric":
        return sql.SQL("pg_catalog.trim_scale({})::text").format(c)
    if kind in ("float8", "float4"):
        # -0 = 0 and NaN = NaN are true in PostgreSQL: both map to one bit pattern.
        return sql.SQL(
            "pg_catalog.encode(pg_catalog.{send}(CASE WHEN {c} = 0 THEN 0::{t} "
            "WHEN {c} = 'NaN'::{t} THEN 'NaN'::{t} ELSE {c} END), 'hex')"
        ).format(send=sql.Identifier(_SEND[kind]), c=c, t=sql.SQL(kind))
    if kind in _SEND:
        return sql.SQL("pg_catalog.encode(pg_catalog.{}({}), 'hex')").format(
            sql.Identifier(_SEND[kind]), c
        )
    if kind == "text":
        return sql.SQL("pg_catalog.octet_length({c})::text || ':' || {c}::text").format(c=c)
    if kind == "jsonb":
        # json and jsonb by meaning: jsonb's text, the form the expected state holds.
        return sql.SQL(
            "pg_catalog.octet_length({c}::jsonb::text)::text || ':' || {c}::jsonb::text"
        ).format(c=c)
    if kind == "char":
        # char(n) with its padding, as the expected state holds it: a cast to
        # text would drop the trailing blanks.
        return sql.SQL(
            "pg_catalog.octet_length({c})::text || ':' || "
            "pg_catalog.textin(pg_catalog.bpcharout({c}))"
        ).format(c=c)
    # bytes: 'x' first, so that an empty value is not the empty field of a NULL.
    return sql.SQL("'x' || pg_catalog.encode({}, 'hex')").format(c)


def row_text_sql(columns: Sequence[tuple[str, str]], alias: str | None = None) -> sql.Composed:
    """The canonical row text as a SQL expression over the sink table's columns.

    Args:
        columns: (column name, checksum kind) in checksum order.
        alias: the table alias that qualifies the columns, if any.
    """
    fields = [
        sql.SQL("coalesce({}, '')").format(_field_sql(name, kind, alias)) for name, kind in columns
    ]
    return sql.SQL(" || '|' || ").join(fields) if len(fields) > 1 else sql.Composed(fields)


def row_checksum_sql(columns: Sequence[tuple[str, str]], alias: str | None = None) -> sql.Composed:
    """``hashtextextended(<row text> COLLATE "C", SEED)``: one int8 per row."""
    return sql.SQL('pg_catalog.hashtextextended(({}) COLLATE "C", {})').format(
        row_text_sql(columns, alias), sql.Literal(signed64(SEED))
    )


def server_check_sql() -> tuple[str, list[tuple[str, int]]]:
    """A query and the values a server must return for it to checksum as this module does."""
    samples = ["", "a", "reconcile|3:abc|", "exactly 12 b", "a longer text of 25 bytes"]
    selects = ", ".join(
        f'pg_catalog.hashtextextended({sql.Literal(s).as_string(None)} COLLATE "C", '
        f"{signed64(SEED)})"
        for s in samples
    )
    return f"SELECT {selects}", [(s, signed64(pg_hash_bytes(s.encode(), SEED))) for s in samples]
