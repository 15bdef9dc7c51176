"""The SQL sink's own tables on MariaDB, checked at every bind, with a real co-tenant user.

The sink runs as its own user (``app``: its database, and reading the grant
tables, nothing global); a second real user, the co-tenant, is granted what
each case needs. Each case asserts that the next bind refuses, naming the
table (or the database), the grantee and the privilege, or the problem; and
that a sink on clean tables, or beside grants that reach nothing of its own,
binds. The grants are read from ``mysql.*``: ``information_schema`` shows the
sink's user only its own (asserted, so that the blind spot stays known).
"""

from __future__ import annotations

import pytest

from reconcile.core.contract import OK, ConfigurationError, SinkTxnId, WriterIdentity
from sinks.sql.sink import SqlSink
from tests.fix_mariadb import MariadbTenants

pytestmark = pytest.mark.integration

LOG = "log-1"


@pytest.fixture
def tenants(mariadb_tenants: MariadbTenants) -> MariadbTenants:
    mariadb_tenants.run(
        None,
        "CREATE TABLE `{db}`.orders (k VARCHAR(16) COLLATE utf8mb4_nopad_bin PRIMARY KEY, "
        "v BIGINT, _epoch BIGINT)",
    )
    return mariadb_tenants


def _sink(tenants: MariadbTenants, user: str | None = None) -> SqlSink:
    return SqlSink(tenants.url(user), "orders", name="orders")


def _bind(tenants: MariadbTenants, user: str | None = None) -> None:
    sink = _sink(tenants, user)
    try:
        sink.bind(WriterIdentity("shop", LOG))
    finally:
        sink.close()


def _refusal(tenants: MariadbTenants) -> str:
    with pytest.raises(ConfigurationError) as refused:
        _bind(tenants)
    return str(refused.value)


def test_clean_tables_bind_again(tenants: MariadbTenants) -> None:
    _bind(tenants)
    _bind(tenants)  # the tables found are checked as those created were
    with tenants.connect() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
            "AND TABLE_NAME LIKE 'reconcile_sql_%%'",
            (tenants.db,),
        )
        assert {r[1] for r in cur.fetchall()} == {"InnoDB"}


@pytest.mark.parametrize(
    ("grant", "says"),
    [
        ("GRANT INSERT ON `{db}`.* TO {cotenant}", "grants INSERT to {cotenant}"),
        ("GRANT SELECT ON `{db}`.* TO {cotenant}", "grants SELECT to {cotenant}"),
        ("GRANT DROP ON `{db}`.* TO {cotenant}", "grants DROP to {cotenant}"),
        ("GRANT CREATE ON `{db}`.* TO {cotenant}", "grants CREATE to {cotenant}"),
        ("GRANT DELETE ON `{pattern}`.* TO {cotenant}", "grants DELETE to {cotenant}"),
        ("GRANT UPDATE ON `{db}`.reconcile_sql_fences TO {cotenant}",
         "reconcile_sql_fences` grants UPDATE to {cotenant}"),
        ("GRANT SELECT ON `{db}`.reconcile_sql_fences TO {cotenant}",
         "reconcile_sql_fences` grants SELECT to {cotenant}"),
        ("GRANT UPDATE (generation) ON `{db}`.reconcile_sql_fences TO {cotenant}",
         "reconcile_sql_fences` grants UPDATE (column generation) to {cotenant}"),
        ("GRANT INSERT ON `{db}`.reconcile_sql_commits TO PUBLIC",
         "reconcile_sql_commits` grants INSERT to 'PUBLIC'@''"),
    ],
    ids=["db_insert", "db_select", "db_drop", "db_create", "db_pattern", "table_update",
         "table_select", "column_update", "public"],
)  # fmt: skip
def test_a_grant_to_a_cotenant_is_refused_by_name(
    tenants: MariadbTenants, grant: str, says: str
) -> None:
    _bind(tenants)
    # A pattern grant, as the server matches database names: `ten%` reaches this database.
    tenants.run(None, grant.replace("{pattern}", tenants.db.split("_")[0] + "%"))
    refused = _refusal(tenants)
    assert says.format(cotenant=MariadbTenants.account(tenants.cotenant)) in refused
    assert "refuses to use them" in refused
    # The view the check used to read shows the sink's user none of it.
    with tenants.connect(tenants.app) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM information_schema.SCHEMA_PRIVILEGES WHERE GRANTEE <> %s",
            (MariadbTenants.account(tenants.app),),
        )
        assert cur.fetchone() == (0,)


def test_a_forged_marker_never_makes_an_epoch_skip(tenants: MariadbTenants) -> None:
    # The co-tenant may INSERT into the database: it copies the log id from the
    # fence row and inserts the next epoch's marker. The next bind refuses, so
    # no epoch meets the forged marker.
    sink = _sink(tenants)
    sink.bind(WriterIdentity("shop", LOG))
    txn = SinkTxnId("shop", "orders", 1, 0)
    assert sink.stage(txn, [{"k": "a", "v": 1}]) == OK
    assert sink.prepare(txn) == OK and sink.commit(txn) == OK
    sink.close()
    tenants.run(None, "GRANT SELECT, INSERT ON `{db}`.* TO {cotenant}")
    tenants.run(
        tenants.cotenant,
        "INSERT INTO reconcile_sql_commits SELECT pipeline, sink, 2, 'orders', log_id, "
        "generation, 0 FROM reconcile_sql_fences",
    )
    assert "grants INSERT, SELECT to" in _refusal(tenants)


def test_a_role_the_cotenant_holds_is_another_grantee(tenants: MariadbTenants) -> None:
    role = f"r_{tenants.cotenant}"
    _bind(tenants)
    tenants.run(None, f"CREATE ROLE {role}", f"GRANT {role} TO {{cotenant}}",
                f"GRANT UPDATE ON `{{db}}`.reconcile_sql_fences TO {role}")  # fmt: skip
    try:
        assert f"reconcile_sql_fences` grants UPDATE to '{role}'@''" in _refusal(tenants)
    finally:
        tenants.run(None, f"DROP ROLE {role}")


def test_the_same_name_from_another_host_is_another_user(tenants: MariadbTenants) -> None:
    tenants.run(None, f"CREATE USER '{tenants.app}'@'%'",
                f"GRANT INSERT ON `{{db}}`.* TO '{tenants.app}'@'%'")  # fmt: skip
    try:
        assert f"grants INSERT to '{tenants.app}'@'%'" in _refusal(tenants)
    finally:
        tenants.run(None, f"DROP USER '{tenants.app}'@'%'")


def test_a_sink_user_that_cannot_read_the_grant_tables_is_refused(
    tenants: MariadbTenants,
) -> None:
    tenants.run(None, "REVOKE SELECT ON mysql.tables_priv FROM {app}")
    refused = _refusal(tenants)
    assert "may not read the server's grant tables" in refused
    assert f"GRANT SELECT ON mysql.tables_priv TO '{tenants.app}'@'127.0.0.1'" in refused


@pytest.mark.parametrize(
    ("plant", "says"),
    [
        ("CREATE TRIGGER sneak BEFORE INSERT ON reconcile_sql_commits FOR EACH ROW SET @x = 1",
         "reconcile_sql_commits` has a trigger, 'sneak'"),
        ("ALTER TABLE reconcile_sql_repairs ADD COLUMN note TEXT",
         "reconcile_sql_repairs` has columns"),
        ("ALTER TABLE reconcile_sql_commits DROP PRIMARY KEY, ADD PRIMARY KEY (pipeline, sink, "
         "epoch, generation)", "reconcile_sql_commits` has primary key"),
        ("ALTER TABLE reconcile_sql_fences MODIFY generation INT NOT NULL",
         "reconcile_sql_fences` has column generation of type int, not bigint"),
        ("ALTER TABLE reconcile_sql_commits MODIFY target_table VARCHAR(64) NOT NULL",
         "reconcile_sql_commits` has column target_table of type varchar(64), not text"),
        ("ALTER TABLE reconcile_sql_fences MODIFY generation BIGINT NULL",
         "reconcile_sql_fences` has column generation not NOT NULL"),
        ("ALTER TABLE reconcile_sql_commits MODIFY pipeline VARCHAR(63) NOT NULL",
         "reconcile_sql_commits` has column pipeline in collation utf8mb4_general_ci, not "
         "ascii_bin"),
        ("ALTER TABLE reconcile_sql_commits ENGINE = MyISAM",
         "reconcile_sql_commits` is a MyISAM table, not InnoDB"),
    ],
    ids=["trigger", "extra_column", "primary_key", "retyped", "text_to_varchar", "nullable",
         "collation", "myisam"],
)  # fmt: skip
def test_a_changed_table_is_refused_by_name(tenants: MariadbTenants, plant: str, says: str) -> None:
    _bind(tenants)
    tenants.run(None, plant)
    assert says in _refusal(tenants)


def test_every_finding_is_named_at_once(tenants: MariadbTenants) -> None:
    _bind(tenants)
    tenants.run(None, "ALTER TABLE reconcile_sql_fences ENGINE = Aria",
                "GRANT UPDATE ON `{db}`.reconcile_sql_commits TO {cotenant}")  # fmt: skip
    refused = _refusal(tenants)
    assert "reconcile_sql_fences` is a Aria table, not InnoDB" in refused
    assert "reconcile_sql_commits` grants UPDATE to" in refused


def test_a_view_planted_before_the_first_bind_is_refused(tenants: MariadbTenants) -> None:
    tenants.run(None, "CREATE VIEW reconcile_sql_commits AS SELECT 1 AS pipeline")
    assert "reconcile_sql_commits` is a VIEW, not a base table" in _refusal(tenants)


def test_grants_that_reach_nothing_of_the_sinks_are_not_refused(tenants: MariadbTenants) -> None:
    tenants.run(None, "GRANT ALL ON `elsewhere`.* TO {cotenant}",
                "GRANT SELECT ON `{db}`.orders TO {cotenant}",
                "GRANT INSERT ON `{db}x`.* TO {cotenant}")  # fmt: skip
    _bind(tenants)


def test_the_sink_users_own_grants_are_not_another_users(tenants: MariadbTenants) -> None:
    _bind(tenants)
    tenants.run(None, "GRANT UPDATE ON `{db}`.reconcile_sql_fences TO {app}")
    _bind(tenants)


def test_pipelines_whose_names_differ_only_in_case_are_two(tenants: MariadbTenants) -> None:
    # The database's default collation would take Shop's fence row for shop's.
    for pipeline, log in (("Shop", "log-a"), ("shop", "log-b")):
        sink = _sink(tenants)
        try:
            sink.bind(WriterIdentity(pipeline, log))
        finally:
            sink.close()
    with tenants.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT pipeline, log_id FROM reconcile_sql_fences ORDER BY BINARY pipeline")
        assert cur.fetchall() == (("Shop", "log-a"), ("shop", "log-b"))
