"""The target table on MariaDB: what the write path relies on, checked at bind and in every epoch.

Each case runs the SQL sink against a real server and asserts on the server's
own rows: a session whose defaults are hostile (no strict mode, another time
zone, a row limit, MyISAM by default) changes nothing written or read; a key
column whose collation takes two of the engine's keys for one, or a target
that does not roll back, is refused at bind by name; a column retyped under a
running sink is refused at the write path by name; a lock that a reader holds
is waited out and the epoch retried, a CHECK constraint stops the pipeline.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pymysql
import pytest

from reconcile.core.contract import (
    OK,
    ConfigurationError,
    Fatal,
    InvalidInputError,
    Retryable,
    SinkTxnId,
    WriterIdentity,
)
from reconcile.core.decisions import rejection_of
from sinks.sql.sink import SqlSink
from tests.fix_mariadb import MariadbTenants
from tests.mariadb_server import MariadbServer

pytestmark = pytest.mark.integration

PIPE = "shop"
NOPAD = "COLLATE utf8mb4_nopad_bin"


@pytest.fixture
def db(mariadb_server: MariadbServer) -> Iterator[str]:
    name = mariadb_server.create_database("tg")
    yield name
    mariadb_server.drop_database(name)


def _run(server: MariadbServer, db: str, *statements: str) -> None:
    with server.connect(db) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)


def _rows(server: MariadbServer, db: str, query: str) -> list[tuple[Any, ...]]:
    with server.connect(db) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION time_zone = '+00:00'")
        cur.execute(query)
        return [tuple(r) for r in cur.fetchall()]


def _sink(url: str, table: str = "t", **options: Any) -> SqlSink:
    sink = SqlSink(url, table, name=table, **options)
    sink.bind(WriterIdentity(PIPE, "log-1"))
    return sink


def _epoch(sink: SqlSink, epoch: int, rows: list[dict[str, Any]]) -> Any:
    txn = SinkTxnId(PIPE, sink.name, epoch, 0)
    assert sink.stage(txn, rows) == OK
    outcome = sink.prepare(txn)
    return outcome if outcome != OK else sink.commit(txn)


def _hostile(url: str, statement: str) -> str:
    return f"{url}?init_command={quote(statement)}"


def test_hostile_session_defaults_change_nothing_written_or_read(
    mariadb_server: MariadbServer, db: str
) -> None:
    # What a server's or a user's defaults could be: no strict mode (1000 into
    # TINYINT is clipped to 127 and committed), ANSI quotes, another time zone,
    # one row per SELECT, CHECK constraints off.
    _run(mariadb_server, db, f"CREATE TABLE t (k VARCHAR(8) {NOPAD} PRIMARY KEY, v TINYINT, "
                             "at TIMESTAMP(6) NULL, _epoch BIGINT, CONSTRAINT v_positive "
                             "CHECK (v > 0))")  # fmt: skip
    url = _hostile(
        mariadb_server.url(db),
        "SET SESSION sql_mode = 'ANSI_QUOTES,EMPTY_STRING_IS_NULL', time_zone = '+05:00', "
        "sql_select_limit = 1, check_constraint_checks = 0",
    )
    sink = _sink(url)
    at = datetime.datetime(2024, 1, 1, 12, 0, 0)
    assert _epoch(sink, 1, [{"k": "a", "v": 1, "at": at}, {"k": "b", "v": 2, "at": at}]) == OK
    refused = _epoch(sink, 2, [{"k": "c", "v": 1000, "at": at}])
    assert isinstance(refused, Fatal), refused
    rejected = rejection_of(refused.error)
    assert rejected is not None and rejected.details["column"] == "v"
    assert "column v" in str(rejected) and "epoch 2" in str(rejected)
    unchecked = _epoch(sink, 2, [{"k": "c", "v": -1, "at": at}])
    assert isinstance(unchecked, Fatal), unchecked
    rejected = rejection_of(unchecked.error)
    assert rejected is not None and rejected.details["constraint"] == "v_positive"
    # The server's own rows: the timestamp as UTC, nothing of epoch 2.
    assert _rows(mariadb_server, db, "SELECT k, v, at FROM t ORDER BY k") == [
        ("a", 1, at), ("b", 2, at)
    ]  # fmt: skip
    target = sink.recovery_target(PIPE, None, write=False)
    with target.snapshot(sink.arrow_schema(), ["k"]) as snapshot:
        assert snapshot.pull_all(None).num_rows == 2  # every row, whatever the row limit
    sink.close()


def test_state_tables_are_innodb_whatever_the_default_and_an_abort_leaves_no_marker(
    mariadb_server: MariadbServer, db: str
) -> None:
    # On MyISAM the aborted epoch's marker survived its rollback, and the replay
    # found it and wrote none of the epoch's rows.
    _run(mariadb_server, db, f"CREATE TABLE t (k VARCHAR(8) {NOPAD} PRIMARY KEY, v INT)")
    sink = _sink(_hostile(mariadb_server.url(db), "SET SESSION default_storage_engine = MyISAM"))
    engines = _rows(
        mariadb_server, db, "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
        f"'{db}' AND TABLE_NAME LIKE 'reconcile%'",
    )  # fmt: skip
    assert engines and {e for (e,) in engines} == {"InnoDB"}
    txn = SinkTxnId(PIPE, "t", 1, 0)
    assert sink.stage(txn, [{"k": "a", "v": 1}]) == OK
    assert sink.prepare(txn) == OK
    assert sink.abort(txn) == OK
    assert _rows(mariadb_server, db, "SELECT count(*) FROM reconcile_sql_commits") == [(0,)]
    assert _epoch(sink, 1, [{"k": "a", "v": 1}]) == OK
    assert _rows(mariadb_server, db, "SELECT k, v FROM t") == [("a", 1)]
    sink.close()


def test_a_target_that_does_not_roll_back_is_refused(
    mariadb_server: MariadbServer, db: str
) -> None:
    _run(mariadb_server, db, "CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE = MyISAM")
    with pytest.raises(
        ConfigurationError, match="cannot use table t: it is MyISAM, which does not roll back"
    ):
        _sink(mariadb_server.url(db))


@pytest.mark.parametrize(
    ("column", "says"),
    [
        ("VARCHAR(8) COLLATE utf8mb4_bin", "has collation utf8mb4_bin"),
        ("VARCHAR(8)", "has collation utf8mb4_general_ci"),
        ("VARCHAR(8) COLLATE utf8mb4_unicode_ci", "has collation utf8mb4_unicode_ci"),
        (f"CHAR(8) {NOPAD}", "is char(8), which pads its values"),
        ("BINARY(8)", "is binary(8), which pads its values"),
    ],
    ids=["pad_space_bin", "default_ci", "accents", "char", "binary"],
)
def test_a_key_whose_collation_takes_two_keys_for_one_is_refused(
    mariadb_server: MariadbServer, db: str, column: str, says: str
) -> None:
    _run(mariadb_server, db, f"CREATE TABLE t (k {column} PRIMARY KEY, v INT)")
    with pytest.raises(ConfigurationError) as refused:
        _sink(mariadb_server.url(db))
    assert f"cannot use table t: key column k {says}" in str(refused.value)
    assert "utf8mb4_nopad_bin" in str(refused.value) or "use VAR" in str(refused.value)
    assert _rows(mariadb_server, db, "SELECT count(*) FROM t") == [(0,)]


def test_every_bad_key_column_is_named_at_once(mariadb_server: MariadbServer, db: str) -> None:
    _run(mariadb_server, db, "CREATE TABLE t (a VARCHAR(8), b INT, c VARCHAR(8) COLLATE "
                             "utf8mb4_bin, v INT, PRIMARY KEY (a, b, c))")  # fmt: skip
    with pytest.raises(ConfigurationError) as refused:
        _sink(mariadb_server.url(db))
    assert "key column a has collation utf8mb4_general_ci" in str(refused.value)
    assert "key column c has collation utf8mb4_bin" in str(refused.value)
    assert "key column b" not in str(refused.value)


def test_keys_the_server_would_merge_stay_distinct_under_an_exact_collation(
    mariadb_server: MariadbServer, db: str
) -> None:
    # The server itself takes these for one key under the refused collations.
    merged = _rows(mariadb_server, db, "SELECT 'x' = 'x ' COLLATE utf8mb4_bin, "
                                       "'A' = 'a' COLLATE utf8mb4_general_ci")  # fmt: skip
    assert merged == [(1, 1)]
    _run(mariadb_server, db, f"CREATE TABLE t (k VARCHAR(8) {NOPAD}, j VARBINARY(8), v INT, "
                             "_epoch BIGINT, PRIMARY KEY (k, j))")  # fmt: skip
    sink = _sink(mariadb_server.url(db))
    rows = [{"k": k, "j": j, "v": i} for i, (k, j) in
            enumerate([("x", b"x"), ("x ", b"x"), ("A", b"x "), ("a", b"x ")])]  # fmt: skip
    assert _epoch(sink, 1, rows) == OK
    assert _epoch(sink, 2, [{"k": "x ", "j": b"x", "v": 9}]) == OK  # in place, one key only
    got = _rows(mariadb_server, db, "SELECT k, j, v FROM t ORDER BY BINARY k, j")
    assert got == [("A", b"x ", 2), ("a", b"x ", 3), ("x", b"x", 0), ("x ", b"x", 9)]
    sink.close()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("ALTER TABLE t MODIFY v VARCHAR(20)",
         "column v of table t changed from bigint(20) to varchar(20) COLLATE utf8mb4_general_ci"),
        ("ALTER TABLE t DROP COLUMN v", "column v (bigint(20)) of table t was dropped"),
        ("ALTER TABLE t MODIFY k VARCHAR(8) COLLATE utf8mb4_general_ci",
         "column k of table t changed from varchar(8) COLLATE utf8mb4_nopad_bin to varchar(8) "
         "COLLATE utf8mb4_general_ci"),
        ("ALTER TABLE t ENGINE = MyISAM", "table t is now MyISAM, was InnoDB"),
    ],
    ids=["retyped", "dropped", "key_collation", "engine"],
)  # fmt: skip
def test_a_table_changed_under_the_running_sink_is_refused_at_the_write_path(
    mariadb_server: MariadbServer, db: str, change: str, says: str
) -> None:
    _run(mariadb_server, db, f"CREATE TABLE t (k VARCHAR(8) {NOPAD} PRIMARY KEY, v BIGINT, "
                             "_epoch BIGINT)")  # fmt: skip
    sink = _sink(mariadb_server.url(db))
    assert _epoch(sink, 1, [{"k": "a", "v": 1}]) == OK
    _run(mariadb_server, db, change)
    refused = _epoch(sink, 2, [{"k": "b", "v": 2}])
    assert isinstance(refused, Fatal) and isinstance(refused.error, InvalidInputError), refused
    assert says in refused.reason and "epoch 2 refused, nothing of it was written" in refused.reason
    assert _rows(mariadb_server, db, "SELECT k FROM t") == [("a",)]
    assert _rows(mariadb_server, db, "SELECT epoch FROM reconcile_sql_commits") == [(1,)]
    sink.close()


def test_a_column_added_under_the_running_sink_is_written_around(
    mariadb_server: MariadbServer, db: str
) -> None:
    _run(mariadb_server, db, f"CREATE TABLE t (k VARCHAR(8) {NOPAD} PRIMARY KEY, v BIGINT)")
    sink = _sink(mariadb_server.url(db))
    assert _epoch(sink, 1, [{"k": "a", "v": 1}]) == OK
    _run(mariadb_server, db, "ALTER TABLE t ADD COLUMN note TEXT NULL")
    assert _epoch(sink, 2, [{"k": "b", "v": 2}]) == OK
    assert _rows(mariadb_server, db, "SELECT k, v, note FROM t ORDER BY k") == [
        ("a", 1, None), ("b", 2, None)
    ]  # fmt: skip
    sink.close()


def test_a_lock_a_reader_holds_is_retried_and_a_check_violation_stops(
    mariadb_tenants: MariadbTenants,
) -> None:
    tenants = mariadb_tenants
    tenants.run(None, f"CREATE TABLE `{{db}}`.t (k VARCHAR(8) {NOPAD} PRIMARY KEY, v INT, "
                      "CONSTRAINT v_not_negative CHECK (v >= 0))",
                "GRANT SELECT ON `{db}`.t TO {cotenant}")  # fmt: skip
    sink = _sink(tenants.url(query="?init_command=SET%20innodb_lock_wait_timeout%3D1"))
    assert _epoch(sink, 1, [{"k": "a", "v": 1}]) == OK
    # A co-tenant that may only read the target locks a row of it (MariaDB asks
    # no more than SELECT for FOR UPDATE): the epoch waits out the lock, and is
    # tried again; nothing of it is written.
    reader = tenants.connect(tenants.cotenant)
    reader.begin()
    with reader.cursor() as cur:
        cur.execute("SELECT * FROM t WHERE k = 'a' FOR UPDATE")
    try:
        waited = _epoch(sink, 2, [{"k": "a", "v": 2}])
        assert isinstance(waited, Retryable), waited
        assert "Lock wait timeout" in waited.reason
    finally:
        reader.rollback()
        reader.close()
    assert _epoch(sink, 2, [{"k": "a", "v": 2}]) == OK
    refused = _epoch(sink, 3, [{"k": "b", "v": -1}])
    assert isinstance(refused, Fatal), refused
    rejected = rejection_of(refused.error)
    assert rejected is not None and rejected.details["constraint"] == "v_not_negative"
    with tenants.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT k, v FROM t ORDER BY k")
        assert cur.fetchall() == (("a", 2),)
    sink.close()


def test_the_grants_docs_mariadb_md_lists_are_enough(mariadb_server: MariadbServer) -> None:
    # Exactly the statements of docs/mariadb.md's set-up: the target's rows and
    # temporary tables, a database of the engine's own, the grant tables.
    db = mariadb_server.create_database("doc")
    state, user = f"{db}_state", f"'doc_{db[-8:]}'@'127.0.0.1'"
    grants = [
        f"CREATE USER {user}",
        f"CREATE TABLE `{db}`.orders (k VARCHAR(8) {NOPAD} PRIMARY KEY, v INT, _epoch BIGINT)",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{db}`.orders TO {user}",
        f"GRANT CREATE TEMPORARY TABLES ON `{db}`.* TO {user}",
        f"CREATE DATABASE `{state}`",
        f"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `{state}`.* TO {user}",
        *(f"GRANT SELECT ON mysql.{t} TO {user}" for t in ("db", "tables_priv", "columns_priv")),
    ]
    _run(mariadb_server, db, *grants)
    name = user.split("'")[1]
    url = mariadb_server.url(db).replace("//root@", f"//{name}@")
    sink = _sink(url, "orders", state_schema=state)
    try:
        assert _epoch(sink, 1, [{"k": "a", "v": 1}, {"k": "b", "v": 2}]) == OK
        assert _epoch(sink, 2, [{"k": "a", "v": 3}]) == OK
        target = sink.recovery_target(PIPE, None, write=False)
        with target.snapshot(sink.arrow_schema(), ["k"]) as snapshot:
            scoped = snapshot.pull_keys(pa.table({"k": ["b"]}), 1)  # a temporary table
        assert sorted(scoped.column("k").to_pylist()) == ["a", "b"]
        assert _rows(mariadb_server, db, "SELECT k, v FROM orders ORDER BY k") == [
            ("a", 3), ("b", 2)
        ]  # fmt: skip
        alone = pymysql.connect(host="127.0.0.1", port=mariadb_server.port, user=name)
        with alone, pytest.raises(pymysql.err.OperationalError):  # and nothing more than that
            alone.cursor().execute("SELECT * FROM mysql.user")
    finally:
        sink.close()
        _run(mariadb_server, db, f"DROP USER {user}", f"DROP DATABASE `{state}`")
        mariadb_server.drop_database(db)
