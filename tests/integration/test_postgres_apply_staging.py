"""Postgres sink: the session's temp staging tables cannot be redirected by the search_path."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from psycopg import sql

from reconcile.core.contract import OK, Change, SinkTxnId
from sinks.objects.declared import session_stage_name
from sinks.postgres.schema import TableSchema, reflect_table
from sinks.postgres.sink import PostgresSink
from tests.fix_pg import PgServer, markers_table

pytestmark = pytest.mark.integration

PIPE = "pipe"


def stage_table_name(kind: str, schema: TableSchema, columns: tuple[str, ...]) -> str:
    """The name the sink gives its session temp table for (table, columns)."""
    typed = [(c, schema.columns[c].sql_type) for c in columns]
    return session_stage_name(kind, (schema.schema, schema.table), typed)


def test_a_planted_table_earlier_on_the_search_path_gets_nothing_and_gives_nothing(
    pg_server: PgServer,
) -> None:
    db = pg_server.create_database("sp")
    try:
        with pg_server.connect(db) as conn:
            conn.execute("CREATE TABLE public.t (id bigint PRIMARY KEY, v bigint)")
            conn.execute("INSERT INTO public.t VALUES (5, 5)")
            schema = reflect_table(conn, "public", "t")
            # Tables named as the sink's staging tables, in a schema that comes
            # before pg_temp on every session's search_path, holding a row of
            # their own.
            conn.execute("CREATE SCHEMA evil")
            for kind, columns in (("u", ("id", "v")), ("d", ("id",))):
                planted = sql.Identifier("evil", stage_table_name(kind, schema, columns))
                conn.execute(
                    sql.SQL("CREATE TABLE {} AS SELECT {} FROM public.t WITH NO DATA").format(
                        planted, sql.SQL(", ").join(map(sql.Identifier, columns))
                    )
                )
                values = (999, 666) if kind == "u" else (999,)
                conn.execute(
                    sql.SQL("INSERT INTO {} VALUES ({})").format(
                        planted, sql.SQL(", ").join(sql.Placeholder() * len(values))
                    ),
                    values,
                )
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET search_path = evil, pg_temp, public").format(
                    sql.Identifier(db)
                )
            )
        sink = PostgresSink(pg_server.dsn(db), "t", name="t", pipeline=PIPE, schema="public")
        epochs: list[Any] = [
            [{"id": 1, "v": 1}, Change("delete", {"id": 5})],  # binary COPY of dict rows
            pa.table({"id": pa.array([2, 3], pa.int64()), "v": pa.array([2, 3], pa.int64())}),
        ]
        for epoch, rows in enumerate(epochs, start=1):
            txn = SinkTxnId(PIPE, "t", epoch, 0)
            assert sink.stage(txn, rows) == OK
            assert sink.prepare(txn) == OK
            assert sink.commit(txn) == OK
        sink.close()
        with pg_server.connect(db) as conn:
            assert conn.execute("SELECT id, v FROM public.t ORDER BY id").fetchall() == [
                (1, 1),
                (2, 2),
                (3, 3),
            ]
            for kind, expected in (("u", [(999, 666)]), ("d", [(999,)])):
                columns = ("id", "v") if kind == "u" else ("id",)
                planted = sql.Identifier("evil", stage_table_name(kind, schema, columns))
                got = conn.execute(sql.SQL("SELECT * FROM {}").format(planted)).fetchall()
                assert got == expected, kind
            table = markers_table(conn)
            assert table is not None
            count = sql.SQL("SELECT count(*) FROM {}").format(table)
            assert conn.execute(count).fetchone() == (2,)
    finally:
        pg_server.drop_database(db)
