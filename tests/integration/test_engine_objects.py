"""The engine's objects in a user's database hold against a co-tenant who is a real role.

The engine runs as a non-superuser role (``app``). The co-tenant has LOGIN and
CREATE on ``public``, as every role had before PostgreSQL 15 (``tests/cotenants.py``).
Each test reads the database's own state: rows, ACLs, the side table a planted
trigger would write, the error a role gets when it tries.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

from reconcile.core.contract import ConfigurationError, RetryableError
from reconcile.engine.cycle import CommitSucceeded
from sinks.objects.declared import stage_name
from sinks.objects.stages import StageUnavailable
from sinks.postgres.factory import postgres_sink
from sinks.postgres.shared_stage import ensure_stage, reflect_target, sweep_stage
from tests.cotenants import Tenants, lease_of, make_tenants, rows, stage_epoch, staged_cycle
from tests.fix_pg import PgServer

pytestmark = pytest.mark.integration

LEASE_COLUMNS = (
    "pipeline text PRIMARY KEY, holder text NOT NULL, tenure bigint NOT NULL, acquired_at "
    "timestamptz NOT NULL, renewed_at timestamptz NOT NULL, expires_at timestamptz NOT NULL, "
    "backend_pid int"
)
# A lease row that no instance could ever take, set by the co-tenant.
SQUATTER = (
    "INSERT INTO {t} VALUES ('p', 'squatter', 7, now(), now(), now() + interval '100 years', NULL)"
)


@pytest.fixture
def tenants(pg_server: PgServer, pg_db: str) -> Tenants:
    return make_tenants(pg_server, pg_db)


# -- the lease --------------------------------------------------------------------------


def test_a_lease_table_planted_on_the_search_path_is_never_used(tenants: Tenants) -> None:
    t = tenants
    t.run(None, f"GRANT CREATE ON DATABASE {t.db} TO {{app}}")
    t.run(t.cotenant, f"CREATE TABLE public.reconcile_leases ({LEASE_COLUMNS})",
          SQUATTER.format(t="public.reconcile_leases"),
          "GRANT ALL ON public.reconcile_leases TO PUBLIC")  # fmt: skip
    t.plant_spy("public.reconcile_leases")
    lease = lease_of(t)
    taken = lease.try_acquire()
    assert taken is not None and taken.holder == "a" and taken.tenure == 1
    assert lease.renew()
    lease.release()
    lease.close()
    assert t.loot() == 0, "the co-tenant's trigger ran as the engine's role"
    assert t.scalar("SELECT holder FROM public.reconcile_leases") == "squatter"
    assert t.scalar("SELECT tableowner FROM pg_tables WHERE schemaname = 'reconcile' "
                    "AND tablename = 'reconcile_leases'") == t.app  # fmt: skip


@pytest.mark.parametrize("how", ["schema of the co-tenant", "schema open to the co-tenant"])
def test_a_lease_table_planted_in_the_engines_schema_is_refused_before_any_statement(
    tenants: Tenants, how: str
) -> None:
    t = tenants
    if how == "schema of the co-tenant":
        # With CREATE on the database it made schema reconcile before the engine did.
        t.run(None, f"GRANT CREATE ON DATABASE {t.db} TO {{cotenant}}")
        t.run(
            t.cotenant,
            "CREATE SCHEMA reconcile",
            "GRANT USAGE, CREATE ON SCHEMA reconcile TO {app}",
        )
    else:  # an administrator's schema that lets every role create in it
        t.run(None, "CREATE SCHEMA reconcile", "GRANT USAGE, CREATE ON SCHEMA reconcile TO PUBLIC")
    t.run(t.cotenant, f"CREATE TABLE reconcile.reconcile_leases ({LEASE_COLUMNS})",
          SQUATTER.format(t="reconcile.reconcile_leases"),
          "GRANT ALL ON reconcile.reconcile_leases TO {app}")  # fmt: skip
    t.plant_spy("reconcile.reconcile_leases")
    lease = lease_of(t)
    with pytest.raises(ConfigurationError) as caught:
        lease.try_acquire()
    message = str(caught.value)
    assert "refusing to use the lease table reconcile.reconcile_leases" in message, message
    assert f"owned by role {t.cotenant!r}" in message
    assert "triggers ['spy']" in message
    assert "schema reconcile" in message  # its owner, or its grants, named too
    # The same at every try: no retry can mend it.
    with pytest.raises(ConfigurationError):
        lease.current()
    assert not lease.held()
    assert t.loot() == 0
    assert t.scalar("SELECT holder FROM reconcile.reconcile_leases") == "squatter"


def test_a_lease_where_the_role_may_not_create_is_a_configuration_error(tenants: Tenants) -> None:
    t = tenants
    lease = lease_of(t)
    for _ in range(2):  # the same every time: not a RetryableError retried for ever
        with pytest.raises(ConfigurationError) as caught:
            lease.try_acquire()
        assert not isinstance(caught.value, RetryableError)
        message = str(caught.value)
        assert "cannot create reconcile.reconcile_leases" in message, message
        assert f"CREATE SCHEMA reconcile AUTHORIZATION {t.app}" in message
    assert t.scalar("SELECT to_regnamespace('reconcile')") is None
    # A schema made for the engine by someone else, without CREATE for its role.
    t.run(None, "CREATE SCHEMA reconcile", "GRANT USAGE ON SCHEMA reconcile TO {app}")
    with pytest.raises(ConfigurationError, match="permission denied for schema reconcile"):
        lease.try_acquire()
    # Given the schema, it works.
    t.run(None, "ALTER SCHEMA reconcile OWNER TO {app}")
    assert lease.try_acquire() is not None
    lease.close()


def test_a_lease_table_the_role_may_not_write_is_a_configuration_error(tenants: Tenants) -> None:
    t = tenants
    migrator = f"migrator_{uuid.uuid4().hex[:8]}"
    # A migration role made the schema and the table (trusted: owner=), and granted nothing.
    t.run(None, f"CREATE ROLE {migrator}", f"CREATE SCHEMA reconcile AUTHORIZATION {migrator}",
          "GRANT USAGE ON SCHEMA reconcile TO {app}",
          f"CREATE TABLE reconcile.reconcile_leases ({LEASE_COLUMNS})",
          f"ALTER TABLE reconcile.reconcile_leases OWNER TO {migrator}")  # fmt: skip
    lease = lease_of(t, owner=migrator)
    with pytest.raises(ConfigurationError, match="permission denied for table reconcile_leases"):
        lease.try_acquire()
    t.run(None, "GRANT SELECT, INSERT, UPDATE ON reconcile.reconcile_leases TO {app}")
    assert lease.try_acquire() is not None
    lease.close()


# -- the executors' staging tables -------------------------------------------------------


def test_default_privileges_give_other_roles_nothing_of_the_engines_objects(
    tenants: Tenants, tmp_path: Path
) -> None:
    t = tenants
    t.run(
        None,
        f"GRANT CREATE ON DATABASE {t.db} TO {{app}}",
        "ALTER DEFAULT PRIVILEGES FOR ROLE {app} GRANT SELECT, UPDATE ON TABLES TO {cotenant}",
        "ALTER DEFAULT PRIVILEGES FOR ROLE {app} GRANT USAGE, CREATE ON SCHEMAS TO {cotenant}",
    )
    cycle = staged_cycle(t, tmp_path, "p")
    staged = stage_epoch(t, cycle, 0, rows(range(3), "x"))
    schema, table = staged.stage
    assert schema == "reconcile"
    # The co-tenant can neither read nor change a staged row, nor reach the markers.
    for statement in (
        f'SELECT * FROM reconcile."{table}"',
        f"UPDATE reconcile.\"{table}\" SET v = 'forged'",
        "SELECT * FROM reconcile.reconcile_commits",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            t.run(t.cotenant, statement)
    assert isinstance(cycle.run_epoch(0, {"items": staged}), CommitSucceeded)
    got = t.scalar("SELECT array_agg(v ORDER BY id) FROM public.items")
    assert got == ["x0", "x1", "x2"]
    # No ACL entry of the engine's schema or of anything in it names the co-tenant.
    named = "x.grantee = '{cotenant}'::regrole AND n.nspname = 'reconcile'"
    on_schema = "SELECT count(*) FROM pg_namespace n, aclexplode(n.nspacl) x WHERE "
    assert t.scalar(on_schema + named) == 0
    on_tables = (
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, "
        "aclexplode(c.relacl) x WHERE "
    )
    assert t.scalar(on_tables + named) == 0
    # A grant made later is found at the next use, reads included.
    t.run(t.app, f'GRANT SELECT ON reconcile."{table}" TO {{cotenant}}')
    with pytest.raises(StageUnavailable, match=r"readable by other roles: \['cotenant_"):
        stage_epoch(t, cycle, 1, rows(range(1), "y"))
    cycle.close()


def test_a_planted_staging_table_is_refused_by_name(tenants: Tenants, tmp_path: Path) -> None:
    t = tenants
    t.run(None, "CREATE SCHEMA reconcile AUTHORIZATION {app}")
    cycle = staged_cycle(t, tmp_path, "p")  # the sink's own tables are fine
    name = stage_name("p", "items", ("public", "items"), [("id", "bigint"), ("v", "text")])
    # A table of that name that another role owns, with a trigger of its own.
    t.run(None, f'CREATE UNLOGGED TABLE reconcile."{name}" (id bigint, v text, '
                "_reconcile_epoch bigint, _reconcile_task text)",
          f'ALTER TABLE reconcile."{name}" OWNER TO {{cotenant}}',
          f'GRANT ALL ON reconcile."{name}" TO {{app}}')  # fmt: skip
    t.plant_spy(f'reconcile."{name}"')
    with pytest.raises(StageUnavailable) as caught:
        stage_epoch(t, cycle, 0, rows(range(2), "x"))
    message = str(caught.value)
    assert f"refusing to use the staging table reconcile.{name}" in message, message
    assert f"owned by role {t.cotenant!r}" in message and "triggers ['spy']" in message
    assert "must be owner" not in message
    assert t.loot() == 0 and t.scalar(f'SELECT count(*) FROM reconcile."{name}"') == 0
    cycle.close()


def test_two_pipelines_writing_one_target_stage_apart(tenants: Tenants, tmp_path: Path) -> None:
    t = tenants
    t.run(None, f"GRANT CREATE ON DATABASE {t.db} TO {{app}}")
    first, second = staged_cycle(t, tmp_path, "p1"), staged_cycle(t, tmp_path, "p2")
    one = stage_epoch(t, first, 0, rows(range(0, 3), "a"))
    two = stage_epoch(t, second, 0, rows(range(3, 5), "b"))
    assert one.stage != two.stage and one.stage[0] == two.stage[0] == "reconcile"
    # p1 commits and sweeps its own staging table: p2's staged rows stay.
    assert isinstance(first.run_epoch(0, {"items": one}), CommitSucceeded)
    client = postgres_sink(t.dsn(t.app), "items", name="items")
    assert sweep_stage(client.target, one.stage, 0, "test") == 3
    assert t.scalar(f'SELECT count(*) FROM reconcile."{two.stage[1]}"') == 2
    assert isinstance(second.run_epoch(0, {"items": two}), CommitSucceeded)
    got = t.scalar("SELECT array_agg(v ORDER BY id) FROM public.items")
    assert got == ["a0", "a1", "a2", "b3", "b4"]
    first.close()
    second.close()


def test_a_target_too_wide_for_a_staging_table_is_refused_up_front(tenants: Tenants) -> None:
    t = tenants
    t.run(None, f"GRANT CREATE ON DATABASE {t.db} TO {{app}}")
    # 1,598 columns to stage (and _epoch, which is not staged): the staging
    # table has exactly PostgreSQL's 1,600.
    fits = ", ".join(f"c{i} int" for i in range(1597))
    wide = ", ".join(f"c{i} int" for i in range(1598))
    t.run(None, f"CREATE TABLE public.fits (id bigint PRIMARY KEY, {fits}, _epoch bigint)",
          f"CREATE TABLE public.wide (id bigint PRIMARY KEY, {wide})",
          "GRANT SELECT ON public.fits, public.wide TO {app}")  # fmt: skip
    client = postgres_sink(t.dsn(t.app), "fits", name="fits")
    schema, name = ensure_stage(client, reflect_target(client), "p")
    assert (
        t.scalar(f"SELECT relnatts FROM pg_class WHERE oid = '{schema}.\"{name}\"'::regclass")
        == 1600
    )
    client = postgres_sink(t.dsn(t.app), "wide", name="wide")
    with pytest.raises(StageUnavailable) as caught:
        ensure_stage(client, reflect_target(client), "p")
    message = str(caught.value)
    assert "public.wide has 1599 columns to stage" in message, message
    assert "would need 1601, over PostgreSQL's limit of 1600" in message
    tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'reconcile'"
    assert t.scalar(tables) == 1  # the staging table of fits only
