"""Postgres sink: the direct-COPY fast path gives the outcome of the general path, at any size.

Each case runs the same kind of Arrow epoch at 100 rows (always the general
path: COPY into a temp table, then INSERT ... ON CONFLICT) and at 20,000 rows
(where the fast path may COPY straight into the table), in both modes, and
checks the database: the rows, the markers, and what rules and triggers did.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from reconcile.core.contract import OK, Fatal, RejectedError, SinkOutcome, SinkTxnId
from sinks.postgres.apply import apply_with_copy
from sinks.postgres.prepared import PreparedPostgresSink
from sinks.postgres.schema import reflect_table
from sinks.postgres.sink import PostgresSink
from sinks.postgres.staging import EpochBatch, validate_batch
from tests.fix_pg import PgServer, markers_table

pytestmark = pytest.mark.integration

PIPE = "pipe"
SIZES = (100, 20_000)
MODES = {"transactional": PostgresSink, "prepared": PreparedPostgresSink}


def arrow_rows(n: int, *, with_id: bool = True) -> pa.Table:
    columns: dict[str, Any] = {"v": pa.array(range(n), pa.int64())}
    if with_id:
        columns = {"id": pa.array(range(1, n + 1), pa.int64()), **columns}
    return pa.table(columns)


def one_epoch(sink: PostgresSink, rows: Any, epoch: int = 1) -> SinkOutcome:
    """stage, prepare, commit; the first outcome that is not OK, or OK."""
    txn = SinkTxnId(PIPE, sink.name, epoch, 0)
    for step in (lambda: sink.stage(txn, rows), lambda: sink.prepare(txn)):
        outcome = step()
        if outcome != OK:
            sink.abort(txn)
            return outcome
    return sink.commit(txn)


def query(dsn: str, sql_text: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql_text).fetchall()


def stage_tables(dsn: str) -> int:
    """Temp staging tables of the general path that exist now, in any session."""
    return int(
        query(
            dsn,
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname LIKE 'pg\\_temp\\_%' AND c.relname LIKE '\\_reconcile\\_u\\_%'",
        )[0][0]
    )


def markers(dsn: str) -> int:
    """Marker rows, read wherever the sink keeps its tables (a plain role's go to public)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        table = markers_table(conn)
        assert table is not None, "no marker table"
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
    return int(row[0]) if row else 0


@dataclass
class Result:
    outcome: SinkOutcome
    state: dict[str, Any]
    general_path: bool  # a temp staging table was used


def run_case(
    server: PgServer,
    mode: str,
    n: int,
    setup: Callable[[psycopg.Connection[Any]], None],
    rows: pa.Table,
    observe: Callable[[str], dict[str, Any]],
    user: str = "postgres",
) -> Result:
    """A fresh database, the table made by ``setup``, one epoch of ``rows``, then the state."""
    db = server.create_database("fp")
    try:
        with server.connect(db) as conn:
            setup(conn)
        dsn = server.dsn(db, user=user)
        sink = MODES[mode](dsn, "t", name="t", pipeline=PIPE, schema="public")
        try:
            outcome = one_epoch(sink, rows)
            general = stage_tables(server.dsn(db)) > 0
        finally:
            sink.close()
        state = observe(server.dsn(db))
        state["markers"] = markers(server.dsn(db)) if outcome == OK else 0
        return Result(outcome, state, general)
    finally:
        server.drop_database(db)


# -- the cases ------------------------------------------------------------------


def with_rule(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v bigint)")
    conn.execute("CREATE TABLE audit (id bigint)")
    conn.execute(
        "CREATE RULE audit_insert AS ON INSERT TO t DO ALSO INSERT INTO audit VALUES (NEW.id)"
    )


def with_triggers(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v bigint)")
    conn.execute("CREATE TABLE fired (what text)")
    conn.execute(
        "CREATE FUNCTION note() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN INSERT INTO fired VALUES (TG_OP || ' ' || TG_LEVEL); RETURN NULL; END $$"
    )
    conn.execute("CREATE TRIGGER t_ins AFTER INSERT ON t FOR EACH ROW EXECUTE FUNCTION note()")
    conn.execute(
        "CREATE TRIGGER t_upd AFTER UPDATE ON t FOR EACH STATEMENT EXECUTE FUNCTION note()"
    )


def fired(dsn: str) -> dict[str, Any]:
    got = dict(query(dsn, "SELECT what, count(*) FROM fired GROUP BY what"))
    return {"rows": query(dsn, "SELECT count(*) FROM t")[0][0], "fired": got}


def with_identity(kind: str) -> Callable[[psycopg.Connection[Any]], None]:
    def setup(conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            f"CREATE TABLE t (id bigint GENERATED {kind} AS IDENTITY PRIMARY KEY, v bigint)"
        )

    return setup


def with_generated(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "CREATE TABLE t (id bigint PRIMARY KEY, v bigint, "
        "w bigint GENERATED ALWAYS AS (v * 2) STORED)"
    )


def counts(dsn: str) -> dict[str, Any]:
    return {"rows": query(dsn, "SELECT count(*) FROM t")[0][0]}


def rule_state(dsn: str) -> dict[str, Any]:
    return {**counts(dsn), "audit": query(dsn, "SELECT count(*) FROM audit")[0][0]}


@pytest.mark.parametrize("mode", MODES)
def test_a_table_with_an_insert_rule_is_refused_at_every_size(
    pg_server: PgServer, mode: str
) -> None:
    # INSERT ... ON CONFLICT is refused on a table with INSERT rules; a COPY
    # would ignore the rule (rows written, the rule never fired).
    for n in SIZES:
        got = run_case(pg_server, mode, n, with_rule, arrow_rows(n), rule_state)
        assert isinstance(got.outcome, Fatal), (n, got.outcome)
        assert "rules" in got.outcome.reason and "nothing was written" in got.outcome.reason
        assert got.state == {"rows": 0, "audit": 0, "markers": 0}, n


@pytest.mark.parametrize("mode", MODES)
def test_a_deferrable_key_is_refused_at_every_size(pg_server: PgServer, mode: str) -> None:
    # ON CONFLICT cannot use a deferrable unique index as its arbiter; a COPY
    # into a free key range would not notice.
    def setup(conn: psycopg.Connection[Any]) -> None:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY DEFERRABLE, v bigint)")

    for n in SIZES:
        got = run_case(pg_server, mode, n, setup, arrow_rows(n), counts)
        assert isinstance(got.outcome, Fatal), (n, got.outcome)
        assert "DEFERRABLE" in got.outcome.reason and "public.t" in got.outcome.reason
        assert got.state == {"rows": 0, "markers": 0}, n


@pytest.mark.parametrize("mode", MODES)
def test_triggers_fire_alike_at_every_size(pg_server: PgServer, mode: str) -> None:
    # ON CONFLICT DO UPDATE fires the UPDATE statement trigger even when no
    # row conflicts; a COPY would not.
    for n in SIZES:
        got = run_case(pg_server, mode, n, with_triggers, arrow_rows(n), fired)
        assert got.outcome == OK, (n, got.outcome)
        assert got.state == {
            "rows": n,
            "fired": {"INSERT ROW": n, "UPDATE STATEMENT": 1},
            "markers": 1,
        }, n


@pytest.mark.parametrize("mode", MODES)
def test_forced_row_security_gives_one_outcome_at_every_size(
    pg_server: PgServer, mode: str
) -> None:
    # COPY FROM is refused under row security (FORCE applies it to the owner);
    # superusers bypass it, so the table belongs to a plain role.
    role = f"app_{uuid.uuid4().hex[:8]}"
    with pg_server.connect() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")

    def setup(conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"GRANT CREATE ON SCHEMA public TO {role}")
        # The engine's own schema, owned by the role (it has no CREATE on the database).
        conn.execute(f"CREATE SCHEMA reconcile AUTHORIZATION {role}")
        conn.execute(f"SET ROLE {role}")
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v bigint)")
        conn.execute("ALTER TABLE t ENABLE ROW LEVEL SECURITY")
        conn.execute("ALTER TABLE t FORCE ROW LEVEL SECURITY")
        conn.execute("CREATE POLICY everyone ON t USING (true) WITH CHECK (v >= 0)")
        conn.execute("RESET ROLE")

    for n in SIZES:
        got = run_case(pg_server, mode, n, setup, arrow_rows(n), counts, user=role)
        assert got.outcome == OK, (n, got.outcome)
        assert got.state == {"rows": n, "markers": 1}, n
    # A row that the policy refuses: refused at every size, nothing written
    # (42501: a definite rejection, which no retry passes).
    for n in SIZES:
        bad = arrow_rows(n).set_column(1, "v", pa.array([*range(n - 1), -1], pa.int64()))
        got = run_case(pg_server, mode, n, setup, bad, counts, user=role)
        assert isinstance(got.outcome, Fatal), (n, got.outcome)
        assert isinstance(got.outcome.error, RejectedError), (n, got.outcome)
        assert got.outcome.error.sqlstate == "42501" and got.outcome.error.epoch is not None
        assert "row-level security" in got.outcome.reason, got.outcome.reason
        assert got.state == {"rows": 0, "markers": 0}, n


@pytest.mark.parametrize("mode", MODES)
def test_a_generated_always_identity_is_never_written(pg_server: PgServer, mode: str) -> None:
    for n in SIZES:
        db = pg_server.create_database("id")
        try:
            with pg_server.connect(db) as conn:
                with_identity("ALWAYS")(conn)
            sink = MODES[mode](pg_server.dsn(db), "t", name="t", pipeline=PIPE)
            outcome = one_epoch(sink, arrow_rows(n))
            sink.close()
            assert isinstance(outcome, Fatal), (n, outcome)
            reason = outcome.reason
            assert "column 'id'" in reason and "GENERATED ALWAYS AS IDENTITY" in reason, reason
            assert "public.t" in reason and "nothing was written" in reason
            with pg_server.connect(db) as conn:
                # The owning application's next INSERT still gets a fresh id.
                assert conn.execute("INSERT INTO t (v) VALUES (7) RETURNING id").fetchone() == (1,)
                assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)
        finally:
            pg_server.drop_database(db)


@pytest.mark.parametrize("mode", MODES)
def test_dict_rows_that_set_a_generated_column_are_refused(pg_server: PgServer, mode: str) -> None:
    for setup, column, given in (
        (with_identity("ALWAYS"), "id", {"id": 5, "v": 1}),
        (with_generated, "w", {"id": 5, "v": 1, "w": 2}),
    ):
        db = pg_server.create_database("gen")
        try:
            with pg_server.connect(db) as conn:
                setup(conn)
            sink = MODES[mode](pg_server.dsn(db), "t", name="t", pipeline=PIPE, key=("id",))
            outcome = one_epoch(sink, [given])
            sink.close()
            assert isinstance(outcome, Fatal), outcome
            assert f"column {column!r}" in outcome.reason, outcome.reason
            assert "GENERATED ALWAYS" in outcome.reason and "do not give it" in outcome.reason
            assert str(given[column]) in outcome.reason
            assert query(pg_server.dsn(db), "SELECT count(*) FROM t") == [(0,)]
        finally:
            pg_server.drop_database(db)


@pytest.mark.parametrize("mode", MODES)
def test_a_stored_generated_column_is_computed_at_every_size(
    pg_server: PgServer, mode: str
) -> None:
    for n in SIZES:
        got = run_case(
            pg_server,
            mode,
            n,
            with_generated,
            arrow_rows(n),
            lambda dsn: {"w": query(dsn, "SELECT sum(w) = 2 * sum(v), count(*) FROM t")[0]},
        )
        assert got.outcome == OK, (n, got.outcome)
        assert got.state == {"w": (True, n), "markers": 1}


def test_an_identity_written_by_default_takes_the_general_path(pg_server: PgServer) -> None:
    # GENERATED BY DEFAULT accepts explicit values; the fast path is still not
    # taken for an identity column it writes.
    got = run_case(
        pg_server, "transactional", 20_000, with_identity("BY DEFAULT"), arrow_rows(20_000), counts
    )
    assert got.outcome == OK and got.state == {"rows": 20_000, "markers": 1}
    assert got.general_path


def test_a_plain_table_still_takes_the_fast_path(pg_server: PgServer) -> None:
    def plain(conn: psycopg.Connection[Any]) -> None:
        # A foreign key (internal triggers, checked alike by COPY and INSERT)
        # and a disabled trigger do not stop the fast path.
        conn.execute("CREATE TABLE parent (v bigint PRIMARY KEY)")
        conn.execute("INSERT INTO parent SELECT generate_series(0, 20000)")
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v bigint REFERENCES parent)")
        conn.execute(
            "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE 'fired'; END $$"
        )
        conn.execute("CREATE TRIGGER off BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION boom()")
        conn.execute("ALTER TABLE t DISABLE TRIGGER off")

    got = run_case(pg_server, "transactional", 20_000, plain, arrow_rows(20_000), counts)
    assert got.outcome == OK and got.state == {"rows": 20_000, "markers": 1}
    assert not got.general_path
    small = run_case(pg_server, "transactional", 100, plain, arrow_rows(100), counts)
    assert small.outcome == OK and small.general_path


@pytest.fixture
def triggered(pg_db: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_db) as conn:
        with_triggers(conn)
        conn.commit()
        yield conn


@pytest.mark.parametrize("opt_in", [False, True])
def test_triggers_take_the_fast_path_only_when_the_user_opts_in(
    triggered: psycopg.Connection[Any], opt_in: bool
) -> None:
    conn = triggered
    n = 20_000
    schema = reflect_table(conn, "public", "t")
    batch = validate_batch(schema, EpochBatch(tables=[arrow_rows(n)]), sink="t", epoch=1)
    with conn.cursor() as cur:
        apply_with_copy(cur, schema, batch, 1, append_only=False, direct_copy_triggers=opt_in)
        stage = cur.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema() "
            "AND relname LIKE '\\_reconcile\\_u\\_%'"
        ).fetchone()
    conn.commit()
    assert stage == ((0,) if opt_in else (1,))
    got = dict(conn.execute("SELECT what, count(*) FROM fired GROUP BY what").fetchall())
    # Opted in, COPY fires the row triggers but not ON CONFLICT's UPDATE
    # statement trigger: that is what the user accepts.
    assert got == ({"INSERT ROW": n} if opt_in else {"INSERT ROW": n, "UPDATE STATEMENT": 1})
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (n,)


@pytest.mark.parametrize("caller", ["epoch", "repair"])
def test_no_ddl_can_change_the_table_between_the_catalog_read_and_the_copy(
    pg_db: str, caller: str
) -> None:
    from reconcile.core import hooks
    from sinks.postgres.apply import DIRECT_COPY_CHECKED

    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v bigint)")
        conn.execute("CREATE TABLE audit (id bigint)")
        conn.execute(
            "CREATE FUNCTION note() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN INSERT INTO audit VALUES (NEW.id); RETURN NULL; END $$"
        )
    refused: list[str] = []

    def add_a_rule_and_a_trigger() -> None:
        # Another session tries the DDL that would change what COPY does.
        with psycopg.connect(pg_db, autocommit=True) as other:
            other.execute("SET lock_timeout = '300ms'")
            for ddl in (
                "CREATE RULE audit_insert AS ON INSERT TO t DO ALSO INSERT INTO audit "
                "VALUES (NEW.id)",
                "CREATE TRIGGER t_ins AFTER INSERT ON t FOR EACH ROW EXECUTE FUNCTION note()",
                "ALTER TABLE t ENABLE ROW LEVEL SECURITY",
            ):
                try:
                    other.execute(ddl)
                except psycopg.errors.LockNotAvailable:
                    refused.append(ddl.split()[1])

    with hooks.at(DIRECT_COPY_CHECKED, add_a_rule_and_a_trigger) as window:
        if caller == "epoch":
            # The epoch locks the table before it reads the catalog (foreign.py).
            sink = PostgresSink(pg_db, "t", name="t", pipeline=PIPE)
            assert one_epoch(sink, arrow_rows(20_000)) == OK
            sink.close()
        else:
            # A repair's apply holds no lock on the table of its own: the fast
            # path's lock is all that keeps the catalog read true.
            with psycopg.connect(pg_db) as conn:
                schema = reflect_table(conn, "public", "t")
                batch = EpochBatch(tables=[arrow_rows(20_000)])
                checked = validate_batch(schema, batch, sink="t", epoch=1)
                with conn.cursor() as cur:
                    apply_with_copy(cur, schema, checked, 1, append_only=False)
    assert window.fired == 1
    assert refused == ["RULE", "TRIGGER", "TABLE"]
    assert query(pg_db, "SELECT count(*) FROM t") == [(20_000,)]
    assert query(pg_db, "SELECT count(*) FROM audit") == [(0,)]
