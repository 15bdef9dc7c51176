"""The SQL sink's own tables on MariaDB, checked at every bind: planted or reachable ones refused.

Each case plants what another user could do to the markers, fences or repairs
(a trigger, a grant, a view under their name, a changed column) and asserts
that the next sink to bind refuses, naming the table and the problem, and
that a sink on clean tables binds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from reconcile.core.contract import ConfigurationError, WriterIdentity
from sinks.sql.sink import SqlSink
from tests.mariadb_server import MariadbServer

pytestmark = pytest.mark.integration

_users = itertools.count()


@pytest.fixture
def db(mariadb_server: MariadbServer) -> Iterator[str]:
    name = mariadb_server.create_database("chk")
    with mariadb_server.connect(name) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE orders (id INT PRIMARY KEY, v INT)")
    yield name
    mariadb_server.drop_database(name)


@pytest.fixture
def other(mariadb_server: MariadbServer) -> Iterator[str]:
    """Another user of the server: ``'name'@'127.0.0.1'``."""
    user = f"other{next(_users)}_{id(mariadb_server) % 10_000}"
    with mariadb_server.connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE USER '{user}'@'127.0.0.1'")
    yield f"'{user}'@'127.0.0.1'"
    with mariadb_server.connect() as conn, conn.cursor() as cur:
        cur.execute(f"DROP USER IF EXISTS '{user}'@'127.0.0.1'")


def _bind(server: MariadbServer, db: str) -> None:
    sink = SqlSink(server.url(db), "orders", name="orders")
    try:
        sink.bind(WriterIdentity("shop", "log-1"))
    finally:
        sink.close()


def _plant(server: MariadbServer, db: str, statement: str) -> None:
    with server.connect(db) as conn, conn.cursor() as cur:
        cur.execute(statement)


def test_clean_tables_bind_again(mariadb_server: MariadbServer, db: str) -> None:
    _bind(mariadb_server, db)
    _bind(mariadb_server, db)  # the tables found are checked as those created were


@pytest.mark.parametrize(
    ("plant", "says"),
    [
        ("CREATE TRIGGER sneak BEFORE INSERT ON reconcile_sql_commits FOR EACH ROW SET @x = 1",
         "reconcile_sql_commits` has a trigger, 'sneak'"),
        ("GRANT UPDATE ON {db}.reconcile_sql_fences TO {other}",
         "reconcile_sql_fences` grants UPDATE to {other}"),
        ("GRANT UPDATE (generation) ON {db}.reconcile_sql_fences TO {other}",
         "reconcile_sql_fences` grants UPDATE to {other}"),
        ("GRANT INSERT ON {db}.* TO {other}", "where {other} holds INSERT"),
        ("GRANT DELETE ON `{pattern}`.* TO {other}", "where {other} holds DELETE"),
        ("ALTER TABLE reconcile_sql_repairs ADD COLUMN note TEXT",
         "reconcile_sql_repairs` has columns"),
        ("ALTER TABLE reconcile_sql_commits DROP PRIMARY KEY, ADD PRIMARY KEY (pipeline, sink, "
         "epoch, generation)", "reconcile_sql_commits` has primary key"),
    ],
    ids=["trigger", "table_grant", "column_grant", "database_grant", "pattern_grant",
         "extra_column", "primary_key"],
)  # fmt: skip
def test_a_table_another_user_can_write_or_that_changed_is_refused(
    mariadb_server: MariadbServer, db: str, other: str, plant: str, says: str
) -> None:
    _bind(mariadb_server, db)
    # A pattern grant, as MySQL matches database names: `chk%` reaches this database.
    pattern = db.split("_")[0] + "%"
    _plant(mariadb_server, db, plant.format(db=db, other=other, pattern=pattern))
    with pytest.raises(ConfigurationError) as refused:
        _bind(mariadb_server, db)
    assert says.format(other=other) in str(refused.value)
    assert "refuses to use it" in str(refused.value)


def test_a_view_planted_before_the_first_bind_is_refused(
    mariadb_server: MariadbServer, db: str
) -> None:
    _plant(mariadb_server, db, "CREATE VIEW reconcile_sql_commits AS SELECT 1 AS pipeline")
    with pytest.raises(ConfigurationError, match="reconcile_sql_commits` is a VIEW, not a base"):
        _bind(mariadb_server, db)


def test_a_grant_on_another_database_is_not_this_ones(
    mariadb_server: MariadbServer, db: str, other: str
) -> None:
    _plant(mariadb_server, db, f"GRANT ALL ON `elsewhere`.* TO {other}")
    _plant(mariadb_server, db, f"GRANT SELECT ON {db}.orders TO {other}")
    _bind(mariadb_server, db)


def test_the_sink_users_own_grants_are_not_another_users(
    mariadb_server: MariadbServer, db: str, other: str
) -> None:
    # The sink connects as ``other``, who holds the database and a table grant: its own.
    _bind(mariadb_server, db)  # the tables created as root
    _plant(mariadb_server, db, f"GRANT ALL ON {db}.* TO {other}")
    _plant(mariadb_server, db, f"GRANT UPDATE ON {db}.reconcile_sql_fences TO {other}")
    user = other.split("'")[1]
    url = mariadb_server.url(db).replace("//root@", f"//{user}@")
    sink = SqlSink(url, "orders", name="orders")
    try:
        sink.bind(WriterIdentity("shop", "log-1"))
    finally:
        sink.close()
