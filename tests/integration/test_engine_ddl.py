"""Every object a run of the engine creates in a database is one ``sinks.objects`` declares.

An event trigger (the test's, as the superuser) notes every object created
while the engine's Postgres surfaces run as their own role: a sink bound, epochs
with upserts and deletes, a staged epoch, a repair, a lease. And the one object
the engine adds to a user's table on request, the ``_epoch`` column with its
index, is added whole or not at all.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

from reconcile.core.contract import ConfigurationError
from reconcile.engine.cycle import CommitCycle, CommitSucceeded
from reconcile.engine.expected import ExpectedState
from sinks.objects.declared import (
    ENGINE_SCHEMA,
    LEASES,
    REALTIME_OFFSETS,
    SESSION_SCHEMA,
    STATE_TABLES,
    epoch_index_name,
)
from sinks.postgres.factory import postgres_sink
from tests.cotenants import Tenants, lease_of, make_tenants, rows, stage_epoch
from tests.fix_pg import PgServer

pytestmark = pytest.mark.integration


@pytest.fixture
def tenants(pg_server: PgServer, pg_db: str) -> Tenants:
    return make_tenants(pg_server, pg_db)


# -- every object created, as the database saw it ------------------------------------------


def declared_object(tag: str, kind: str, schema: str | None, identity: str) -> bool:
    """Whether an object the event trigger saw is one that sinks.objects declares, where it says."""
    tables = {t.name for t in (*STATE_TABLES, LEASES, REALTIME_OFFSETS)}
    digest = "[0-9a-f]{16}"
    name = identity.split(".", 1)[-1]
    if kind == "schema":
        return identity == ENGINE_SCHEMA
    if schema == ENGINE_SCHEMA and kind == "table":
        return name in tables or re.fullmatch(f"_reconcile_stage_{digest}", name) is not None
    if schema == ENGINE_SCHEMA and kind == "index":
        pkeys = {f"{t}_pkey" for t in tables}
        return name in pkeys or re.fullmatch(f"_reconcile_stage_{digest}_task", name) is not None
    if schema == SESSION_SCHEMA and kind == "table":
        return re.fullmatch(f"_reconcile_[ud]_{digest}", name) is not None
    # Asked for with create_epoch_column=True: the target's _epoch and its index.
    if identity == "public.orders":
        return tag == "ALTER TABLE"
    return kind == "index" and identity == f"public.{epoch_index_name('orders')}"


NOTE_DDL = (
    "CREATE FUNCTION public.note_ddl() RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER "
    "AS $$BEGIN INSERT INTO public.ddl_seen SELECT command_tag, object_type, schema_name, "
    "object_identity FROM pg_event_trigger_ddl_commands(); END$$"
)


def test_every_object_a_run_creates_is_a_declared_one(tenants: Tenants, tmp_path: Path) -> None:
    """An event trigger notes each object created while the engine's surfaces run, as its role."""
    from reconcile.core.contract import Change
    from reconcile.recovery import recover

    t = tenants
    t.run(
        None,
        f"GRANT CREATE ON DATABASE {t.db} TO {{app}}",
        "CREATE TABLE public.orders (id bigint PRIMARY KEY, v text NOT NULL)",
        "ALTER TABLE public.orders OWNER TO {app}",  # so that it may add _epoch
        "GRANT CREATE ON SCHEMA public TO {app}",  # and its index
        "CREATE TABLE public.ddl_seen (tag text, kind text, schema text, identity text)",
        NOTE_DDL,
        "CREATE EVENT TRIGGER note_ddl ON ddl_command_end EXECUTE FUNCTION public.note_ddl()",
    )
    expected = ExpectedState(str(tmp_path), "p", {"orders": ["id"]})
    sink = postgres_sink(t.dsn(t.app), "orders", name="orders", create_epoch_column=True)
    cycle = CommitCycle("p", [sink], expected_state=expected)
    cycle.start()
    for epoch, changes in enumerate([[{"id": 1, "v": "a"}, {"id": 2, "v": "b"}],
                                     [Change("delete", {"id": 2})]]):  # fmt: skip
        assert isinstance(cycle.run_epoch(epoch, {"orders": changes}), CommitSucceeded)
    staged = stage_epoch(t, cycle, 2, rows(range(3, 5), "s"), target="orders")
    assert isinstance(cycle.run_epoch(2, {"orders": staged}), CommitSucceeded)
    cycle.close()
    t.run(None, "UPDATE public.orders SET v = 'drift' WHERE id = 1")
    # One row of three: past the mass-change brake's default 10 %, so lifted.
    report = recover(t.dsn(t.app), str(tmp_path), "p", "orders", allow_mass_change=True)
    assert report.applied == 1
    lease = lease_of(t)
    assert lease.try_acquire() is not None
    lease.close()
    with psycopg.connect(t.dsn(), autocommit=True) as conn:
        conn.execute("DROP EVENT TRIGGER note_ddl")
        seen = conn.execute(
            "SELECT DISTINCT tag, kind, schema, identity FROM public.ddl_seen "
            "WHERE tag NOT IN ('GRANT', 'REVOKE') ORDER BY 1, 4"
        ).fetchall()
    undeclared = [row for row in seen if not declared_object(*row)]
    assert undeclared == [], f"created, but not declared in sinks.objects: {undeclared}"
    kinds = {(kind, schema) for _, kind, schema, _ in seen}
    # Not vacuous: each surface did create what it declares.
    assert {("schema", None), ("table", "reconcile"), ("index", "reconcile"),
            ("table", "pg_temp"), ("index", "public")} <= kinds, seen  # fmt: skip
    assert ("CREATE TABLE", "table", "reconcile", "reconcile.reconcile_leases") in seen
    assert any(identity.startswith("reconcile._reconcile_stage_") for *_, identity in seen)


@pytest.mark.parametrize("why", ["no CREATE on the schema", "its name is taken"])
def test_the_epoch_column_and_its_index_are_added_together_or_not_at_all(
    tenants: Tenants, tmp_path: Path, why: str
) -> None:
    t = tenants
    t.run(None, f"GRANT CREATE ON DATABASE {t.db} TO {{app}}",
          "CREATE TABLE public.orders (id bigint PRIMARY KEY, v text NOT NULL)",
          "ALTER TABLE public.orders OWNER TO {app}")  # fmt: skip
    if why == "its name is taken":
        t.run(None, "GRANT CREATE ON SCHEMA public TO {app}",
              f"CREATE TABLE public.{epoch_index_name('orders')} (x int)")  # fmt: skip
    sink = postgres_sink(t.dsn(t.app), "orders", name="orders", create_epoch_column=True)
    cycle = CommitCycle("p", [sink], tmp_path / "progress")
    with pytest.raises(ConfigurationError) as caught:
        cycle.start()
    message = str(caught.value)
    assert "public.orders" in message and "nothing was added" in message, message
    column = "SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.orders'::regclass "
    assert t.scalar(column + "AND attname = '_epoch'") == 0
