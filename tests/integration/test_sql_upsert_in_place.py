"""MariaDB's upserts in place (INSERT ... ON DUPLICATE KEY UPDATE) write what delete + insert does.

Each case is checked on the server's own rows: the in-place path is taken only
where it cannot differ (the key is the whole primary key, no other unique
index, as read in the writing transaction), and the tables here are shaped to
tell the two apart where it would. A unique index added while a sink runs is
seen by its next epoch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from reconcile.core.contract import OK, Change, Fatal, SinkTxnId, WriterIdentity
from reconcile.core.decisions import rejection_of
from sinks.sql.rows import upserts_in_place, write_rows
from sinks.sql.shape import lock_target, read_shape
from sinks.sql.sink import SqlSink
from tests.mariadb_server import MariadbServer

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(mariadb_server: MariadbServer) -> Iterator[sa.Engine]:
    name = mariadb_server.create_database("up")
    engine = sa.create_engine(mariadb_server.url(name))
    yield engine
    engine.dispose()
    mariadb_server.drop_database(name)


def _table(engine: sa.Engine, ddl: str) -> sa.Table:
    with engine.begin() as conn:
        conn.exec_driver_sql(ddl)
    name = ddl.split()[2]
    return sa.Table(name, sa.MetaData(), autoload_with=engine)


def _write(
    engine: sa.Engine, table: sa.Table, keys: list[str], items: list[Any], epoch: int
) -> int:
    with engine.begin() as conn:
        return write_rows(conn, table, keys, items, epoch)


def _rows(engine: sa.Engine, table: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM {table} ORDER BY 1, 2")]


def _in_place(engine: sa.Engine, table: sa.Table, keys: list[str]) -> bool:
    with engine.begin() as conn:
        lock_target(conn, None, table.name)
        return upserts_in_place(conn, read_shape(conn, None, table.name), keys)


def _statements(engine: sa.Engine) -> list[str]:
    seen: list[str] = []
    sa.event.listen(engine, "before_cursor_execute",
                    lambda conn, cur, statement, *rest: seen.append(statement))  # fmt: skip
    return seen


def test_upserts_and_deletes_of_a_two_column_key_in_place(engine: sa.Engine) -> None:
    table = _table(engine, "CREATE TABLE t (a INT, b VARCHAR(8), v INT, _epoch BIGINT, "
                           "PRIMARY KEY (a, b))")  # fmt: skip
    keys = ["a", "b"]
    # 2,001 keys, 1,001 of them deleted below: two chunks, of 1,000 keys and of one.
    first = [{"a": i, "b": "x" if i % 2 else "y", "v": i} for i in range(2001)]
    assert _write(engine, table, keys, first, 1) == 2001
    assert _in_place(engine, table, keys)
    seen = _statements(engine)
    changes: list[Any] = [Change("delete", {"a": r["a"], "b": r["b"]}) for r in first[:2001:2]]
    changes += [{"a": 1, "b": "x", "v": -1}, {"a": 5000, "b": "z", "v": 7}]
    assert _write(engine, table, keys, changes, 2) == 1001 + 2
    got = _rows(engine, "t")
    expected = sorted(
        [(r["a"], r["b"], r["v"], 1) for r in first[1:2001:2] if r["a"] != 1]
        + [(1, "x", -1, 2), (5000, "z", 7, 2)]
    )
    assert got == expected
    deletes = [s for s in seen if s.startswith("DELETE")]
    inserts = [s for s in seen if s.startswith("INSERT")]
    # Two chunked deletes, no per-key delete of the upserted rows; one upsert statement.
    assert len(deletes) == 2 and all(" IN " in s for s in deletes), deletes
    assert len(inserts) == 1 and "ON DUPLICATE KEY UPDATE" in inserts[0]


def test_a_table_of_key_columns_only_takes_a_row_again_without_error(engine: sa.Engine) -> None:
    table = _table(engine, "CREATE TABLE k (a INT, b INT, PRIMARY KEY (a, b))")
    _write(engine, table, ["a", "b"], [{"a": 1, "b": 2}, {"a": 2, "b": 2}], 1)
    _write(engine, table, ["a", "b"], [{"a": 1, "b": 2}, {"a": 3, "b": 3}], 2)
    assert _rows(engine, "k") == [(1, 2), (2, 2), (3, 3)]


def test_another_unique_index_keeps_delete_and_insert(engine: sa.Engine) -> None:
    # In place, the new key 3 clashing on email would silently rewrite key 1's row;
    # delete + insert refuses it on the constraint, and the epoch aborts.
    table = _table(engine, "CREATE TABLE u (id INT PRIMARY KEY, email VARCHAR(20) UNIQUE, "
                           "v INT)")  # fmt: skip
    _write(engine, table, ["id"], [{"id": 1, "email": "a@x", "v": 1}], 1)
    assert not _in_place(engine, table, ["id"])
    with pytest.raises(sa.exc.IntegrityError):
        _write(engine, table, ["id"], [{"id": 3, "email": "a@x", "v": 3}], 2)
    assert _rows(engine, "u") == [(1, "a@x", 1)]


def test_a_row_without_a_column_gets_its_default_in_place_as_delete_and_insert_gives(
    engine: sa.Engine,
) -> None:
    table = _table(engine, "CREATE TABLE d (id INT PRIMARY KEY, v INT, note VARCHAR(8) "
                           "DEFAULT 'dflt')")  # fmt: skip
    _write(engine, table, ["id"], [{"id": 1, "v": 1, "note": "hand"}], 1)
    assert _in_place(engine, table, ["id"])
    _write(engine, table, ["id"], [{"id": 1, "v": 2}], 2)
    assert _rows(engine, "d") == [(1, 2, "dflt")]


def test_a_key_that_is_not_the_primary_key_keeps_delete_and_insert(engine: sa.Engine) -> None:
    # The table's primary key is a surrogate; the sink's key is ``code``, with no
    # unique index on it: ON DUPLICATE KEY would never fire and the key would repeat.
    table = _table(engine, "CREATE TABLE s (id INT AUTO_INCREMENT PRIMARY KEY, code INT, v INT)")
    _write(engine, table, ["code"], [{"id": 1, "code": 7, "v": 1}], 1)
    _write(engine, table, ["code"], [{"id": 2, "code": 7, "v": 2}], 2)
    assert _rows(engine, "s") == [(2, 7, 2)]


def test_a_key_that_is_only_part_of_the_primary_key_keeps_delete_and_insert(
    engine: sa.Engine,
) -> None:
    # ON DUPLICATE KEY fires on (a, b): key a=1 written again with another b would
    # be a second row of key 1 in place; delete + insert keeps one.
    table = _table(engine, "CREATE TABLE p (a INT, b INT, v INT, PRIMARY KEY (a, b))")
    assert not _in_place(engine, table, ["a"])
    _write(engine, table, ["a"], [{"a": 1, "b": 1, "v": 1}, {"a": 2, "b": 1, "v": 2}], 1)
    _write(engine, table, ["a"], [{"a": 1, "b": 2, "v": 3}], 2)
    assert _rows(engine, "p") == [(1, 2, 3), (2, 1, 2)]


def test_a_two_column_key_in_another_order_than_the_primary_key_is_in_place(
    engine: sa.Engine,
) -> None:
    table = _table(engine, "CREATE TABLE o (a INT, b INT, v INT, PRIMARY KEY (b, a))")
    assert _in_place(engine, table, ["a", "b"])
    _write(engine, table, ["a", "b"], [{"a": 1, "b": 2, "v": 1}], 1)
    _write(engine, table, ["a", "b"], [{"a": 1, "b": 2, "v": 2}, {"a": 2, "b": 1, "v": 3}], 2)
    assert _rows(engine, "o") == [(1, 2, 2), (2, 1, 3)]


def test_a_primary_key_on_a_prefix_keeps_delete_and_insert(engine: sa.Engine) -> None:
    # A prefix index takes 'abcd1' and 'abcd2' for one key: in place, the second
    # would overwrite the first; delete + insert refuses it on the key.
    table = _table(engine, "CREATE TABLE x (k VARCHAR(16) COLLATE utf8mb4_nopad_bin, v INT, "
                           "PRIMARY KEY (k(4)))")  # fmt: skip
    assert not _in_place(engine, table, ["k"])
    _write(engine, table, ["k"], [{"k": "abcd1", "v": 1}], 1)
    with pytest.raises(sa.exc.IntegrityError):
        _write(engine, table, ["k"], [{"k": "abcd2", "v": 2}], 2)
    assert _rows(engine, "x") == [("abcd1", 1)]


def test_a_unique_index_added_while_the_sink_runs_is_seen_by_the_next_epoch(
    engine: sa.Engine,
) -> None:
    _table(engine, "CREATE TABLE u (id INT PRIMARY KEY, email VARCHAR(20), v INT)")
    sink = SqlSink(str(engine.url.render_as_string(hide_password=False)), "u", name="u")
    sink.bind(WriterIdentity("shop", "log-1"))
    first = SinkTxnId("shop", "u", 1, 0)
    assert sink.stage(first, [{"id": 1, "email": "a@x", "v": 1}]) == OK
    assert sink.prepare(first) == OK and sink.commit(first) == OK
    with engine.begin() as conn:  # someone else, under the running sink
        conn.exec_driver_sql("ALTER TABLE u ADD UNIQUE INDEX u_email (email)")
    second = SinkTxnId("shop", "u", 2, 0)
    assert sink.stage(second, [{"id": 3, "email": "a@x", "v": 3}]) == OK
    outcome = sink.prepare(second)
    # In place, key 3 would have rewritten key 1's row; delete + insert is refused
    # on the new index, and the epoch stops, naming it.
    assert isinstance(outcome, Fatal), outcome
    rejected = rejection_of(outcome.error)
    assert rejected is not None and rejected.details["constraint"] == "u_email"
    assert _rows(engine, "u") == [(1, "a@x", 1)]
    sink.close()
