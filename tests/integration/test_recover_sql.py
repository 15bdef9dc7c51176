"""The generic SQL path: SqlSink passes the contract suite; recover() through SQLAlchemy.

On SQLite (a file), on PostgreSQL through SQLAlchemy (not the COPY fast path) and on MariaDB.
"""

from __future__ import annotations

import datetime as dt
import decimal
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa

from expected_state.store import ExpectedStateStore
from reconcile import CommitCycle, CommitSucceeded, InvalidInputError, recover
from reconcile.core import hooks
from reconcile.core.contract import Change, MassChangeError, SinkTxnId
from reconcile.recovery.in_parts import PART
from reconcile.testing import check_sink
from sinks.sql.sink import SqlSink
from tests.fix_pg import PgServer
from tests.mariadb_server import MariadbServer

pytestmark = pytest.mark.integration

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("amount", pa.decimal128(12, 2)),
        ("ratio", pa.float64()),
        ("day", pa.date32()),
        ("at", pa.timestamp("us")),
        ("flag", pa.bool_()),
        ("blob", pa.binary()),
    ]
)
DDL = (
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, name TEXT, amount NUMERIC(12, 2), "
    "ratio {float}, day DATE, at {ts}, flag BOOLEAN, blob {blob}, _epoch BIGINT)"
)


class SqliteHarness:
    """SqlSink over SQLite files, one per sink; every row write audited by a trigger.

    One file per sink: SQLite has one writer per database file, and a sink holds
    its epoch's write transaction open from prepare to commit, so two sinks of a
    pipeline in one file would wait on each other until the busy timeout.
    """

    kind = "sql"

    def __init__(self, folder: Path) -> None:
        folder.mkdir()
        self.folder = folder

    def url(self, name: str) -> str:
        # A writer that finds the database locked waits out the busy timeout (five
        # seconds by default) before it is told to retry; the suite's fencing check
        # meets that lock twice, and half a second shows the same outcome.
        return f"sqlite:///{self.folder / name}.db?timeout=0.5"

    def engine(self, name: str) -> sa.Engine:
        engine = sa.create_engine(self.url(name))
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TABLE IF NOT EXISTS harness_writes (sink TEXT, k TEXT, v BIGINT, e BIGINT)"
            )
        return engine

    def new_sink(self, name: str) -> SqlSink:
        with self.engine(name).begin() as conn:
            conn.exec_driver_sql(
                f'CREATE TABLE IF NOT EXISTS "{name}" (k TEXT PRIMARY KEY, v BIGINT NOT NULL, '
                "_epoch BIGINT NOT NULL)"
            )
            conn.exec_driver_sql(
                f'CREATE TRIGGER IF NOT EXISTS "audit_{name}" AFTER INSERT ON "{name}" BEGIN '
                f"INSERT INTO harness_writes VALUES ('{name}', NEW.k, NEW.v, NEW._epoch); END"
            )
        return SqlSink(self.url(name), name, name=name)

    def committed(self, name: str) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        with self.engine(name).connect() as conn:
            for k, v, e in conn.exec_driver_sql(
                "SELECT k, v, e FROM harness_writes WHERE sink = ? ORDER BY e, k", (name,)
            ):
                out.setdefault(int(e), []).append({"k": k, "v": int(v)})
        return out

    def prepared(self, name: str) -> list[SinkTxnId]:
        return []


def test_the_sql_sink_passes_the_contract_suite_on_sqlite(tmp_path: Path) -> None:
    counter = iter(range(1000))
    # The suite commits thousands of small transactions: in memory (tmpfs, where
    # there is one), SQLite's fsync at each commit costs nothing.
    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else tmp_path
    try:
        report = check_sink(lambda: SqliteHarness(folder / f"h{next(counter)}"))
    finally:
        if folder != tmp_path:
            shutil.rmtree(folder, ignore_errors=True)
    assert report.ok and len(report.passed) > 30


def row(rng: random.Random, i: int, epoch: int) -> dict[str, Any]:
    return {
        "id": i,
        "name": rng.choice([None, "", f"n{i}-{epoch}", "héllo"]),
        "amount": rng.choice([None, decimal.Decimal(rng.randrange(-(10**6), 10**6)) / 100]),
        "ratio": rng.choice([None, 0.5, -2.25, float(epoch)]),
        "day": rng.choice([None, dt.date(2024, 1, 1) + dt.timedelta(days=i)]),
        "at": rng.choice([None, dt.datetime(2024, 1, 1, 12) + dt.timedelta(microseconds=i)]),
        "flag": rng.choice([None, True, False]),
        "blob": rng.choice([None, b"", bytes([i % 256, 7])]),
    }


def written(url: str, root: Path, epochs: int = 3) -> None:
    """Epochs through a commit cycle with an SqlSink, and the same into the store."""
    rng = random.Random(3)
    store = ExpectedStateStore(str(root), "shop", "orders", ["id"], schema=SCHEMA)
    cycle = CommitCycle("shop", [SqlSink(url, "orders", name="orders")], root / "progress")
    cycle.start()
    try:
        for e in range(epochs):
            rows = [row(rng, i, e) for i in range(e * 20, e * 20 + 30)]
            store.apply(e, [Change("upsert", r) for r in rows])
            assert isinstance(cycle.run_epoch(e, {"orders": rows}), CommitSucceeded)
    finally:
        cycle.close()


def sink_rows(url: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(url)
    table = sa.Table("orders", sa.MetaData(), autoload_with=engine)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(*(table.c[n] for n in SCHEMA.names)).order_by(table.c.id))
        out = [tuple(r) for r in rows]
    engine.dispose()
    return out


def expected(root: Path) -> list[tuple[Any, ...]]:
    store = ExpectedStateStore(str(root), "shop", "orders", ["id"])
    rows = store.snapshot(columns=SCHEMA.names).sort_by("id").to_pylist()
    return [tuple(r[n] for n in SCHEMA.names) for r in rows]


def drift(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM orders WHERE id IN (1, 2)")
        conn.exec_driver_sql("UPDATE orders SET name = 'hand', ratio = NULL WHERE id = 40")
        conn.exec_driver_sql("INSERT INTO orders (id, name) VALUES (500, 'new')")
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        path = tmp_path / "sink.db"
        engine = sa.create_engine(f"sqlite:///{path}")
        with engine.begin() as conn:
            conn.exec_driver_sql(DDL.format(float="REAL", blob="BLOB", ts="TIMESTAMP"))
        yield f"sqlite:///{path}"
        return
    if request.param == "mariadb":
        maria: MariadbServer = request.getfixturevalue("mariadb_server")
        db = maria.create_database("sql")
        with maria.connect(db) as mconn, mconn.cursor() as cur:
            # DATETIME(6): MariaDB's TIMESTAMP is a time zone's, and to the second;
            # BLOB is a reserved word there.
            ddl = DDL.format(float="DOUBLE", blob="BLOB", ts="DATETIME(6)")
            cur.execute(ddl.replace(" blob ", " `blob` "))
        yield maria.url(db)
        maria.drop_database(db)
        return
    server: PgServer = request.getfixturevalue("pg_server")
    name = server.create_database("sql")
    with server.connect(name) as conn:
        conn.execute(DDL.format(float="DOUBLE PRECISION", blob="BYTEA", ts="TIMESTAMP"))
    yield f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/{name}"
    server.drop_database(name)


@pytest.mark.parametrize(("mode", "chunk_rows"), [("full", None), ("auto", None), ("full", 7)])
def test_hand_drift_found_and_repaired_through_sqlalchemy(
    url: str, tmp_path: Path, mode: str, chunk_rows: int | None
) -> None:
    # chunk_rows 7: the 90 stored rows are spilled and diffed in 13 parts.
    chunks = {} if chunk_rows is None else {"chunk_rows": chunk_rows}
    written(url, tmp_path)
    clean = recover(url, str(tmp_path), "shop", "orders", mode=mode, dry_run=True,
                    fast_path=False, **chunks)  # fmt: skip
    assert not clean.drift and clean.rows_pulled == 70
    drift(url)
    with hooks.at(PART, lambda: None, times=100) as parts:
        found = recover(url, str(tmp_path), "shop", "orders", mode=mode, dry_run=True,
                        fast_path=False, **chunks)  # fmt: skip
    assert parts.hits == (0 if chunk_rows is None else 13)
    assert (found.missing, found.extra, found.changed, found.mode) == (2, 1, 1, "full")
    repaired = recover(url, str(tmp_path), "shop", "orders", mode=mode, fast_path=False,
                       **chunks)  # fmt: skip
    assert repaired.applied == 4
    assert sink_rows(url) == expected(tmp_path)
    again = recover(url, str(tmp_path), "shop", "orders", mode=mode, fast_path=False)
    assert not again.drift and again.applied == 0


def test_a_sink_behind_the_store_is_scoped_through_sqlalchemy(url: str, tmp_path: Path) -> None:
    written(url, tmp_path)
    rng = random.Random(9)
    store = ExpectedStateStore(str(tmp_path), "shop", "orders", ["id"])
    store.apply(3, [Change("upsert", row(rng, i, 3)) for i in range(65, 75)]
                + [Change("delete", {"id": 0})])  # fmt: skip
    report = recover(url, str(tmp_path), "shop", "orders", mode="scoped", fast_path=False)
    assert report.rows_pulled == 6  # the sink's rows of the 11 changed keys
    assert (report.missing, report.extra) == (5, 1)
    assert sink_rows(url) == expected(tmp_path)
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        markers = conn.exec_driver_sql(
            "SELECT epoch FROM reconcile_sql_commits ORDER BY epoch"
        ).fetchall()
    engine.dispose()
    assert [m[0] for m in markers] == [0, 1, 2, 3]


def test_buckets_mode_says_it_runs_on_postgres_only(url: str, tmp_path: Path) -> None:
    written(url, tmp_path, epochs=1)
    with pytest.raises(InvalidInputError, match="PostgreSQL"):
        recover(url, str(tmp_path), "shop", "orders", mode="buckets", fast_path=False)


def test_a_repair_to_an_epoch_older_than_the_newest_marker_is_refused(
    url: str, tmp_path: Path
) -> None:
    # recover(target_epoch=0) on a sink at epoch 2 must not take acknowledged
    # epochs back. The brake is lifted so that only the marker check stands.
    written(url, tmp_path)
    before = sink_rows(url)
    with pytest.raises(InvalidInputError, match="cannot repair to epoch 0, older than the "
                       r"sink's newest marker \(2\); nothing was written"):  # fmt: skip
        recover(url, str(tmp_path), "shop", "orders", mode="full", target_epoch=0,
                fast_path=False, allow_mass_change=True)  # fmt: skip
    assert sink_rows(url) == before
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        markers = conn.exec_driver_sql("SELECT max(epoch) FROM reconcile_sql_commits").scalar()
        repairs = conn.exec_driver_sql("SELECT count(*) FROM reconcile_sql_repairs").scalar()
    engine.dispose()
    assert (markers, repairs) == (2, 0)
    # Exactly at the newest marker is allowed (and finds nothing to do).
    same = recover(url, str(tmp_path), "shop", "orders", mode="full", target_epoch=2,
                   fast_path=False)  # fmt: skip
    assert not same.drift and same.applied == 0


def test_the_mass_change_brake_holds_on_the_sql_path(url: str, tmp_path: Path) -> None:
    written(url, tmp_path)  # 70 rows
    drift(url)  # 1 extra, 1 changed (and 2 missing, not counted) of 69 rows
    before = sink_rows(url)
    # Scoped mode counts the table in its transaction (it pulls only the scope;
    # the row inserted by hand has no _epoch, so it is outside the scope).
    for mode, since, counted in (("full", None, 2), ("scoped", -1, 1)):
        with pytest.raises(MassChangeError, match=f"delete or change {counted} of the 69 rows"):
            recover(url, str(tmp_path), "shop", "orders", mode=mode, since_epoch=since,
                    fast_path=False, max_change_fraction=0.01)  # fmt: skip
        assert sink_rows(url) == before
    # 0.029 of 69 rows is 2.001: the repair goes through.
    done = recover(url, str(tmp_path), "shop", "orders", mode="full", fast_path=False,
                   max_change_fraction=0.029)  # fmt: skip
    assert (done.brake_counted, done.brake_limit, done.applied) == (2, 2, 4)
    assert sink_rows(url) == expected(tmp_path)
