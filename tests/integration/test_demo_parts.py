"""The demo's parts, without Spark: the feed, a run's settings, the tables, the proxy's chaos."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reconcile.core.contract import ConfigurationError
from reconcile.demo.tpch import supervisor
from reconcile.demo.tpch.data import Feed, generate
from reconcile.demo.tpch.status import status_line
from reconcile.demo.tpch.summary import Summary
from reconcile.demo.tpch.supervisor import Options, _check_run, prepare_tables, run_settings
from reconcile.spark.outputs import apply_transform
from reconcile.testing.pg_proxy import FaultProxy
from tests.fix_pg import PgServer

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def tpch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("tpch"), 0.01)


def test_the_feed_cuts_lineitem_by_order_key_with_every_line_of_an_order_in_one_file(
    tpch: Path, tmp_path: Path
) -> None:
    feed = Feed(tpch, tmp_path / "inbox", 7)
    times = [feed.drop(i) for i in range(7)]
    assert times == sorted(times)
    lineitem = pq.read_table(tpch / "lineitem.parquet", columns=["l_orderkey", "l_linenumber"])
    seen: dict[int, int] = {}  # order -> the file holding its lines
    count = 0
    for i in range(7):
        part = pq.read_table(feed.path(i), columns=["l_orderkey", "l_linenumber"])
        count += part.num_rows
        for key in part.column("l_orderkey").to_pylist():
            assert seen.setdefault(key, i) == i, f"order {key} is split over two files"
        assert part.num_rows == feed.slices[i].rows > 0
    assert count == lineitem.num_rows
    assert list(seen) == sorted(seen)  # ascending order keys, file after file
    assert feed.dropped() == list(range(7))
    assert feed.drop(3) == times[3]  # a resumed run drops nothing twice


def test_a_file_written_ahead_is_dropped_whole_with_the_drop_as_its_event_time(
    tpch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed = Feed(tpch, tmp_path / "inbox", 4)
    feed.write_ahead([1, 2])
    assert feed.dropped() == []  # written beside the inbox: the stream sees nothing yet

    # A feed killed mid-write leaves only a ``.part``, which no drop renames in.
    def killed_mid_write(table: pa.Table, where: Path) -> None:
        Path(where).write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(pq, "write_table", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        feed.write_ahead([3])
    monkeypatch.undo()
    written = (feed.tmp / feed.path(1).name).stat().st_mtime
    dropped = feed.drop(1)
    assert dropped > written and feed.dropped() == [1]
    assert pq.read_table(feed.path(1)).num_rows == feed.slices[1].rows
    feed.drop(3)  # written whole at its drop
    assert pq.read_table(feed.path(3)).num_rows == feed.slices[3].rows
    fresh = Feed(tpch, tmp_path / "again", 4)
    fresh.drop(1)
    assert pq.read_table(feed.path(1)).equals(pq.read_table(fresh.path(1)))


def test_a_feed_of_more_epochs_than_orders_is_refused(tpch: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="more than the 15000 orders"):
        Feed(tpch, tmp_path / "inbox", 15001)


def test_a_resume_must_match_the_run_it_resumes(tmp_path: Path) -> None:
    assert _check_run(tmp_path / "a", Options(pg="host=x", epochs=5)) is False
    assert _check_run(tmp_path / "a", Options(pg="host=x", epochs=5)) is True
    with pytest.raises(ConfigurationError, match="--epochs 5"):
        _check_run(tmp_path / "a", Options(pg="host=x", epochs=6))
    with pytest.raises(ConfigurationError, match="give the same --pg"):
        _check_run(tmp_path / "a", Options(epochs=5))
    _check_run(tmp_path / "b", Options())
    with pytest.raises(ConfigurationError, match="embedded Postgres server, which is gone"):
        _check_run(tmp_path / "b", Options())


def test_a_fresh_run_refuses_another_runs_rows_until_reset(pg_db: str) -> None:
    prepare_tables(pg_db, resumed=False, reset=False)
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("INSERT INTO demo_customer_revenue VALUES (1, 2.5, 1, 0)")
        conn.execute("CREATE SCHEMA reconcile")
        conn.execute("CREATE TABLE reconcile.reconcile_commits (pipeline text, epoch int)")
        conn.execute("INSERT INTO reconcile.reconcile_commits VALUES ('demo', 0), ('other', 0)")
    with pytest.raises(ConfigurationError, match="demo_customer_revenue holds 1 rows"):
        prepare_tables(pg_db, resumed=False, reset=False)
    prepare_tables(pg_db, resumed=True, reset=False)  # a resume keeps them
    prepare_tables(pg_db, resumed=False, reset=True)
    with psycopg.connect(pg_db) as conn:
        assert conn.execute("SELECT count(*) FROM demo_customer_revenue").fetchone() == (0,)
        left = conn.execute("SELECT pipeline FROM reconcile.reconcile_commits").fetchall()
        assert left == [("other",)]  # only the demo's markers go


def test_proxy_chaos_drops_only_the_chosen_applications_commits(pg_server: PgServer) -> None:
    proxy = FaultProxy(pg_server.port)
    try:
        proxy.chaos(1, 1.0, applications=("reconcile:",))
        dsn = pg_server.dsn(port=proxy.port)
        for _ in range(3):  # another application: never touched
            with psycopg.connect(dsn, application_name="other") as conn:
                conn.execute("SELECT 1")
        assert sum(proxy.injected.values()) == 0
        chosen = psycopg.connect(dsn, application_name="reconcile:demo:x")
        chosen.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError):
            chosen.commit()  # its COMMIT draws a fault at rate 1
        chosen.close()
        assert sum(proxy.injected.values()) == 1
        with pytest.raises(ValueError, match="rate"):
            proxy.chaos(1, 1.5)
    finally:
        proxy.close()


def test_a_transform_of_two_arguments_gets_the_batch_id() -> None:
    def given(*args: object) -> pa.Table:
        return pa.table({"args": [repr(args)]})

    assert apply_transform(lambda batch: given(batch), "b", 4) == given("b")
    assert apply_transform(lambda batch, batch_id: given(batch, batch_id), "b", 4) == given("b", 4)
    assert apply_transform(lambda batch, scale=2: given(batch, scale), "b", 4) == given("b", 2)


def test_a_transform_that_returns_neither_a_frame_nor_arrow_is_named() -> None:
    with pytest.raises(ConfigurationError, match="sink 'totals' returned NoneType"):
        apply_transform(lambda batch: None, "b", 4, sink="totals")
    with pytest.raises(ConfigurationError, match="returned str"):
        apply_transform(str, 7, 4)


def test_the_summary_reports_chaos_settings_only_when_chaos_is_on() -> None:
    calm = run_settings(Options(pg="host=x password=secret"))
    assert (calm["chaos"], calm["crashes"], calm["drop_rate"]) == (None, 0, 0.0)
    assert "pg" not in calm
    chaos = run_settings(Options(chaos=3))
    assert (chaos["chaos"], chaos["crashes"], chaos["drop_rate"]) == (3, 4, 0.15)


def test_the_summary_names_no_workdir_that_the_run_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    used: list[Path] = []

    def fake_run(workdir: Path, options: Options) -> Summary:
        # The demo's own work (Spark, Postgres) is not what is tested: only
        # what run() reports about the folder afterwards.
        used.append(workdir)
        workdir.mkdir(exist_ok=True)
        (workdir / "events.jsonl").write_text("")
        return Summary(
            epochs=1, committed_epochs=1, crashes=0, crash_points=[], ambiguous_commits=0,
            ambiguous_resolutions={}, connection_faults={}, recoveries=0, recovered_rows=0,
            replayed_epochs=0, missing=0, extra=0, changed=0, source_check={}, verified=True,
            latency_ms={}, launches=1, failures=0, workdir=str(workdir),
        )  # fmt: skip

    monkeypatch.setattr(supervisor, "_run", fake_run)
    removed = supervisor.run(Options())
    assert removed.workdir is None and not used[-1].exists()
    kept = supervisor.run(Options(keep=True))
    assert kept.workdir == str(used[-1]) and used[-1].exists()
    shutil.rmtree(used[-1])
    given = supervisor.run(Options(workdir=tmp_path / "mine"))
    assert given.workdir == str(tmp_path / "mine")


def test_the_steps_around_the_epochs_name_themselves_on_a_terminal_only() -> None:
    import io

    from rich.console import Console

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with status_line(console, True, "generating TPC-H scale 1") as step:
        console.print("a line")  # rich draws the spinner under each line printed
        step("checking the tables against TPC-H itself")
        console.print("another line")
    drawn = screen.getvalue()
    assert drawn.index("generating TPC-H scale 1") < drawn.index("checking the tables")
    # Not a terminal (a log file, --json): nothing drawn, the steps still run.
    quiet = io.StringIO()
    with status_line(Console(file=quiet), False, "verifying") as step:
        step("checking the tables against TPC-H itself")
    assert quiet.getvalue() == ""
