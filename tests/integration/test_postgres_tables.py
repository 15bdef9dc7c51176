"""The marker and fence tables: where they live; start-up refuses tables that are not ours.

The sink runs as a non-superuser role; another non-superuser role plants or
tampers with the tables, as in the attack this guards against.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from reconcile.core.contract import ConfigurationError
from reconcile.engine.cycle import CommitCycle, CommitSucceeded
from reconcile.engine.progress_file import FileProgressLog
from sinks.postgres.factory import postgres_sink
from tests.fix_pg import PgServer

pytestmark = pytest.mark.integration

PIPE = "shop"
COLUMNS = (
    "pipeline text NOT NULL, sink text NOT NULL, epoch bigint NOT NULL, target_schema text "
    "NOT NULL, target_table text NOT NULL, log_id text, xid xid8 NOT NULL, backend_pid integer "
    "NOT NULL, generation bigint NOT NULL, row_count bigint NOT NULL, committed_at timestamptz "
    "NOT NULL DEFAULT clock_timestamp()"
)
FENCE_COLUMNS = (
    "pipeline text NOT NULL, sink text NOT NULL, generation bigint NOT NULL, log_id text, "
    "updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (pipeline, sink)"
)


@dataclass
class Roles:
    server: PgServer
    db: str
    app: str  # the sink's role
    intruder: str
    migrator: str

    def dsn(self, user: str) -> str:
        return self.server.dsn(self.db, user=user)

    def execute(self, user: str | None, *statements: str) -> None:
        """Run statements as ``user`` (None: the superuser); {app} etc. are filled in."""
        names = {"app": self.app, "intruder": self.intruder, "migrator": self.migrator}
        with psycopg.connect(
            self.server.dsn(self.db, user=user or "postgres"), autocommit=True
        ) as c:
            for statement in statements:
                c.execute(statement.format(**names).encode())

    def scalar(self, query: str) -> Any:
        with psycopg.connect(self.server.dsn(self.db), autocommit=True) as c:
            row = c.execute(query.encode()).fetchone()
        return None if row is None else row[0]


@pytest.fixture
def roles(pg_server: PgServer, pg_db: str) -> Iterator[Roles]:
    suffix = uuid.uuid4().hex[:8]
    db = conninfo_to_dict(pg_db)["dbname"]
    assert isinstance(db, str)
    r = Roles(pg_server, db, f"app_{suffix}", f"intruder_{suffix}", f"migrator_{suffix}")
    r.execute(
        None,
        "CREATE ROLE {app} LOGIN",
        "CREATE ROLE {intruder} LOGIN",
        "CREATE ROLE {migrator} LOGIN",
        f"GRANT CONNECT, TEMPORARY ON DATABASE {db} TO {{app}}",
        "CREATE TABLE public.a (k text PRIMARY KEY, v bigint, _epoch bigint)",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON public.a TO {app}",
    )
    yield r


def cycle(roles: Roles, state: Path, **options: Any) -> CommitCycle:
    sink = postgres_sink(roles.dsn(roles.app), "a", name="orders", **options)
    return CommitCycle(PIPE, [sink], FileProgressLog(state, PIPE))


def refused(roles: Roles, state: Path, **options: Any) -> str:
    c = cycle(roles, state, **options)
    with pytest.raises(ConfigurationError) as err:
        c.start()
    return str(err.value)


def runs(roles: Roles, state: Path, epochs: range, **options: Any) -> None:
    c = cycle(roles, state, **options)
    c.start()
    for e in epochs:
        assert c.run_epoch(e, {"orders": [{"k": f"e{e}", "v": e}]}) == CommitSucceeded(e)
    c.close()


def plant_spy(roles: Roles, schema: str) -> None:
    """As the intruder: a marker table without a key, and a trigger that runs as its caller."""
    roles.execute(
        roles.intruder,
        f"CREATE TABLE {schema}.loot (who text, at timestamptz DEFAULT now())",
        f"CREATE TABLE {schema}.reconcile_commits ({COLUMNS})",
        f"CREATE TABLE {schema}.reconcile_fences ({FENCE_COLUMNS})",
        f"CREATE FUNCTION {schema}.spy() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$BEGIN INSERT INTO {schema}.loot (who) VALUES (current_user); RETURN NEW; END$$",
        f"CREATE TRIGGER spy BEFORE INSERT ON {schema}.reconcile_commits "
        f"FOR EACH ROW EXECUTE FUNCTION {schema}.spy()",
        f"GRANT USAGE ON SCHEMA {schema} TO {{app}}",
        f"GRANT ALL ON {schema}.loot, {schema}.reconcile_commits, {schema}.reconcile_fences "
        "TO {app}",
    )


def test_tables_planted_by_another_role_in_the_targets_schema_are_refused(
    roles: Roles, tmp_path: Path
) -> None:
    roles.execute(None, "GRANT CREATE ON SCHEMA public TO {intruder}")
    plant_spy(roles, "public")
    message = refused(roles, tmp_path / "s", state_schema="public")
    assert f"owned by role {roles.intruder!r}" in message
    assert (
        "no (immediate) primary key" in message and "PRIMARY KEY (pipeline, sink, epoch)" in message
    )
    assert "triggers ['spy']" in message
    # The trigger never ran with the sink's privileges, and nothing was written.
    assert roles.scalar("SELECT count(*) FROM public.loot") == 0
    assert roles.scalar("SELECT count(*) FROM public.a") == 0


def test_a_planted_default_schema_is_refused(roles: Roles, tmp_path: Path) -> None:
    roles.execute(None, f"GRANT CREATE ON DATABASE {roles.db} TO {{intruder}}")
    roles.execute(roles.intruder, "CREATE SCHEMA reconcile")
    plant_spy(roles, "reconcile")
    message = refused(roles, tmp_path / "s")
    assert f"schema reconcile is owned by role {roles.intruder!r}" in message
    assert "triggers ['spy']" in message
    assert "CREATE SCHEMA reconcile AUTHORIZATION" in message  # what to do
    assert roles.scalar("SELECT count(*) FROM reconcile.loot") == 0


TAMPERING = {
    "triggers ['t']": [
        "CREATE FUNCTION public.t() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$",
        "CREATE TRIGGER t BEFORE UPDATE ON reconcile.reconcile_fences "
        "FOR EACH ROW EXECUTE FUNCTION public.t()",
    ],
    "rules ['r']": ["CREATE RULE r AS ON UPDATE TO reconcile.reconcile_fences DO ALSO NOTIFY x"],
    "row-level security": ["ALTER TABLE reconcile.reconcile_commits ENABLE ROW LEVEL SECURITY"],
    "is unlogged": ["ALTER TABLE reconcile.reconcile_commits SET UNLOGGED"],
    "writable by other roles": ["GRANT INSERT ON reconcile.reconcile_commits TO {intruder}"],
    "no (immediate) primary key": [
        "ALTER TABLE reconcile.reconcile_commits DROP CONSTRAINT reconcile_commits_pkey"
    ],
    "has columns": ["ALTER TABLE reconcile.reconcile_commits ADD COLUMN note text"],
    "owned by role": ["ALTER TABLE reconcile.reconcile_fences OWNER TO {intruder}"],
    # The repairs table (pull-and-diff) is checked like the other two.
    "reconcile_repairs has triggers ['t2']": [
        "CREATE FUNCTION public.t2() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$",
        "CREATE TRIGGER t2 BEFORE INSERT ON reconcile.reconcile_repairs "
        "FOR EACH ROW EXECUTE FUNCTION public.t2()",
    ],
    "reconcile_repairs has columns": ["ALTER TABLE reconcile.reconcile_repairs ADD COLUMN x text"],
}


@pytest.mark.parametrize("finding", list(TAMPERING))
def test_tampered_tables_are_refused_at_start_up(
    roles: Roles, tmp_path: Path, finding: str
) -> None:
    # The sink may create the dedicated schema: its tables go there, owned by it.
    roles.execute(None, f"GRANT CREATE ON DATABASE {roles.db} TO {{app}}")
    runs(roles, tmp_path / "s", range(1))
    assert (
        roles.scalar("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'reconcile'")
        == roles.app
    )
    roles.execute(None, *TAMPERING[finding])
    message = refused(roles, tmp_path / "s")
    assert finding in message, message


def test_tables_of_a_named_owner_are_trusted(roles: Roles, tmp_path: Path) -> None:
    roles.execute(
        None,
        f"GRANT CREATE ON DATABASE {roles.db} TO {{migrator}}",
        f"GRANT CONNECT ON DATABASE {roles.db} TO {{migrator}}",
        "GRANT SELECT ON public.a TO {migrator}",
    )
    # A migration role creates the state tables once, and grants them to the sink's role.
    setup = postgres_sink(roles.dsn(roles.migrator), "a", name="orders", pipeline=PIPE)
    setup.setup()
    roles.execute(
        roles.migrator,
        "GRANT USAGE ON SCHEMA reconcile TO {app}",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA reconcile TO {app}",
    )
    roles.execute(None, "DELETE FROM reconcile.reconcile_fences")  # the set-up's own claim
    assert f"owned by role {roles.migrator!r}" in refused(roles, tmp_path / "s")
    runs(roles, tmp_path / "s", range(2), state_owner=roles.migrator)
    assert roles.scalar("SELECT count(*) FROM public.a") == 2


def test_where_the_tables_live(roles: Roles, tmp_path: Path) -> None:
    # Without CREATE on the database, the dedicated schema cannot be made. There
    # is no fallback to the target's schema (its readers use it; before
    # PostgreSQL 15 everyone may create in public): refused, saying what to do,
    # and nothing is created anywhere.
    roles.execute(None, "GRANT CREATE ON SCHEMA public TO {app}")
    message = refused(roles, tmp_path / "s")
    assert "cannot create schema reconcile" in message, message
    assert "CREATE SCHEMA reconcile AUTHORIZATION" in message
    assert roles.scalar("SELECT to_regclass('public.reconcile_commits')") is None
    # A schema made for the role once: the tables go there, owned by it.
    roles.execute(None, "CREATE SCHEMA reconcile AUTHORIZATION {app}")
    runs(roles, tmp_path / "s", range(1))
    assert roles.scalar("SELECT count(*) FROM reconcile.reconcile_commits") == 1
    # Two marker tables would split the markers: refused, naming both.
    roles.execute(None, f"CREATE TABLE public.reconcile_commits ({COLUMNS})")
    message = refused(roles, tmp_path / "s")
    assert "reconcile.reconcile_commits and public.reconcile_commits" in message
    assert "state_schema=" in message


def test_tables_an_older_version_left_in_the_targets_schema_are_refused_until_moved(
    roles: Roles, tmp_path: Path
) -> None:
    # An older version put the tables in the target's schema when it could not
    # create its own. They are still found there (never a second set of
    # markers), but public is usable by every role: refused, saying how to move.
    roles.execute(None, "GRANT CREATE ON SCHEMA public TO {app}")
    roles.execute(
        roles.app,
        f"CREATE TABLE public.reconcile_commits ({COLUMNS}, PRIMARY KEY (pipeline, sink, epoch))",
        f"CREATE TABLE public.reconcile_fences ({FENCE_COLUMNS})",
    )
    message = refused(roles, tmp_path / "s")
    assert "schema public grants ['PUBLIC USAGE']" in message, message
    assert "ALTER TABLE public.<each of" in message and "SET SCHEMA reconcile" in message
    assert roles.scalar("SELECT to_regclass('public.reconcile_repairs')") is None
    # Moved as it says: the same markers, now in a schema of the role's own.
    roles.execute(None, "CREATE SCHEMA reconcile AUTHORIZATION {app}")
    roles.execute(
        roles.app,
        "ALTER TABLE public.reconcile_commits SET SCHEMA reconcile",
        "ALTER TABLE public.reconcile_fences SET SCHEMA reconcile",
    )
    runs(roles, tmp_path / "s", range(2))
    assert roles.scalar("SELECT count(*) FROM reconcile.reconcile_commits") == 2
    assert roles.scalar("SELECT count(*) FROM public.a") == 2
