"""A database shared with a co-tenant: the engine's role and another real role, and helpers.

The engine runs as a non-superuser role (``app``). The co-tenant has LOGIN and
CREATE on ``public``, as every role had before PostgreSQL 15.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
from psycopg.conninfo import conninfo_to_dict

from reconcile.core.staged import StagedEpoch
from reconcile.engine.cycle import CommitCycle
from reconcile.engine.expected import ExpectedState
from sinks.postgres.factory import postgres_sink
from sinks.postgres.lease import PgLease
from sinks.postgres.shared_stage import copy_to_stage, ensure_stage, reflect_target
from tests.fix_pg import PgServer

__all__ = ["Tenants", "lease_of", "make_tenants", "rows", "stage_epoch", "staged_cycle"]


@dataclass
class Tenants:
    """One test database, the engine's role in it, and a co-tenant role."""

    server: PgServer
    db: str
    app: str  # the engine's role
    cotenant: str

    def dsn(self, user: str | None = None) -> str:
        return self.server.dsn(self.db, user=user or "postgres")

    def run(self, user: str | None, *statements: str) -> None:
        """Run statements as ``user`` (None: the superuser); {app}, {cotenant} filled in."""
        with psycopg.connect(self.dsn(user), autocommit=True) as c:
            for statement in statements:
                c.execute(statement.format(app=self.app, cotenant=self.cotenant).encode())

    def scalar(self, query: str) -> Any:
        with psycopg.connect(self.dsn(), autocommit=True) as c:
            row = c.execute(query.format(app=self.app, cotenant=self.cotenant).encode()).fetchone()
        return None if row is None else row[0]

    def plant_spy(self, table: str) -> None:
        """As the superuser, for the co-tenant: a trigger on ``table`` that notes who ran it."""
        self.run(
            None,
            "CREATE TABLE IF NOT EXISTS public.loot (who text, at timestamptz DEFAULT now())",
            "GRANT ALL ON public.loot TO PUBLIC",
            "CREATE OR REPLACE FUNCTION public.spy() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN INSERT INTO public.loot (who) VALUES (current_user); RETURN NEW; END$$",
            f"CREATE TRIGGER spy BEFORE INSERT OR UPDATE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION public.spy()",
        )

    def loot(self) -> int:
        return int(self.scalar("SELECT count(*) FROM public.loot"))


def make_tenants(server: PgServer, dsn: str) -> Tenants:
    """Two fresh roles on ``dsn``'s database, and a target ``public.items`` the engine may write."""
    suffix = uuid.uuid4().hex[:8]
    db = conninfo_to_dict(dsn)["dbname"]
    assert isinstance(db, str)
    t = Tenants(server, db, f"app_{suffix}", f"cotenant_{suffix}")
    t.run(
        None,
        "CREATE ROLE {app} LOGIN",
        "CREATE ROLE {cotenant} LOGIN",
        f"GRANT CONNECT, TEMPORARY ON DATABASE {db} TO {{app}}",
        "GRANT CREATE ON SCHEMA public TO {cotenant}",  # the pre-15 default
        "CREATE TABLE public.items (id bigint PRIMARY KEY, v text NOT NULL, _epoch bigint)",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON public.items TO {app}",
    )
    return t


def lease_of(t: Tenants, holder: str = "a", **options: Any) -> PgLease:
    return PgLease(t.dsn(t.app), "p", term_s=2.0, holder=holder, **options)


def rows(ids: range, tag: str) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "v": [f"{tag}{i}" for i in ids]})


def staged_cycle(t: Tenants, root: Path, pipeline: str) -> CommitCycle:
    expected = ExpectedState(str(root / pipeline), pipeline, {"items": ["id"]})
    sink = postgres_sink(t.dsn(t.app), "items", name="items")
    cycle = CommitCycle(pipeline, [sink], expected_state=expected)
    cycle.start()
    return cycle


def stage_epoch(
    t: Tenants, cycle: CommitCycle, epoch: int, table: pa.Table, target: str = "items"
) -> StagedEpoch:
    """As the executors do: the store's change file, and the rows COPied into the stage."""
    client = postgres_sink(t.dsn(t.app), target, name=target)
    stage = ensure_stage(client, reflect_target(client), cycle.pipeline)
    copy_to_stage(client.target, stage, epoch, "task-1", table)
    store = cycle.expected_state.tables[target]  # type: ignore[union-attr]
    writer = store.part_writer(table.schema)
    path = writer.write(epoch, writer.net(table)) or ""
    n = table.num_rows
    return StagedEpoch(target, epoch, ("id", "v"), stage, ("task-1",), n, (path,), n, 0)
