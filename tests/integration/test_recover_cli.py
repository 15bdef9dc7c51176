"""``reconcile verify`` / ``repair`` as real processes: exit codes, JSON, bad input, kill -9."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_run import cli
from tests.fix_pg import PASSWORD, PASSWORD_USER, PgServer
from tests.recovery_setup import (
    SIMPLE_DDL,
    SIMPLE_SCHEMA,
    Setup,
    expected_rows,
    make_setup,
    sink_rows,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def simple(pg_db: str, tmp_path: Path) -> Setup:
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(50)])
    setup.write([{"id": i, "name": f"m{i}", "total": -i} for i in range(25, 75)])
    return setup


def args(setup: Setup, command: str, *extra: str) -> list[str]:
    return [command, "--pg", setup.dsn, "--store", setup.root, "--pipeline", "shop",
            "--table", setup.table, *extra]  # fmt: skip


@pytest.mark.timeout(600)  # four CLI processes
def test_verify_then_repair_exit_codes_and_json(simple: Setup) -> None:
    clean = cli(*args(simple, "verify", "--json"))
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["missing"] == 0
    simple.execute("DELETE FROM {t} WHERE id = 1")
    simple.execute("UPDATE {t} SET name = NULL WHERE id = 30")
    simple.execute("INSERT INTO {t} (id, name, total) VALUES (999, 'x', 0)")
    for mode in ["full", "buckets", "auto"]:
        found = cli(*args(simple, "verify", "--mode", mode, "--json"))
        assert found.returncode == 1, found.stderr
        report = json.loads(found.stdout)
        assert {k: report[k] for k in ("missing", "extra", "changed", "applied")} == {
            "missing": 1, "extra": 1, "changed": 1, "applied": 0
        }  # fmt: skip
        assert report["mode"] in ("full", "buckets") and report["seconds"] > 0
    repaired = cli(*args(simple, "repair"))
    assert repaired.returncode == 1, repaired.stderr
    assert "missing 1, extra 1, changed 1" in repaired.stdout and "3 rows" in repaired.stdout
    assert sink_rows(simple) == expected_rows(simple)
    assert cli(*args(simple, "repair")).returncode == 0
    assert cli(*args(simple, "verify")).returncode == 0


def test_kill_9_in_the_middle_of_a_repair_leaves_nothing_and_a_second_run_finishes(
    simple: Setup,
) -> None:
    simple.execute("DELETE FROM {t} WHERE id < 10")
    simple.execute("UPDATE {t} SET total = 7 WHERE id >= 70")  # within the brake's 10 %
    before = sink_rows(simple)
    killed = cli(*args(simple, "repair", "--mode", "full"),
                 env={"RECONCILE_KILL_AT": "pg.repair.applied"})  # fmt: skip
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    assert sink_rows(simple) == before  # nothing half-applied
    assert simple.scalar("SELECT count(*) FROM reconcile.reconcile_repairs") == 0
    # The second run diffs in parts of 10 rows (the store holds 100): the same answer.
    spill = Path(simple.root) / "spill"
    spill.mkdir()
    bad = cli(*args(simple, "repair", "--mode", "full", "--chunk-rows", "0"))
    assert bad.returncode == 2 and "chunk_rows must be a positive number" in bad.stderr
    done = cli(*args(simple, "repair", "--mode", "full", "--json", "--chunk-rows", "10",
                     "--spill-dir", str(spill)))  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["applied"] == 10 + 5
    assert sink_rows(simple) == expected_rows(simple)
    assert list(spill.iterdir()) == []


def nothing_written(setup: Setup, before: dict[object, object]) -> None:
    assert sink_rows(setup) == before
    assert setup.scalar("SELECT count(*) FROM reconcile.reconcile_repairs") == 0


def test_a_table_not_in_the_store_is_an_error_and_writes_nothing(simple: Setup) -> None:
    simple.execute("CREATE TABLE other (id bigint PRIMARY KEY, v text)")
    before = sink_rows(simple)
    out = cli(*[a if a != "orders" else "other" for a in args(simple, "repair")])
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "holds no epoch" in out.stderr
    assert "'other'" in out.stderr
    # With --json the error is one JSON object too, with the same exit code.
    as_json = cli(*[a if a != "orders" else "other" for a in args(simple, "repair", "--json")])
    assert as_json.returncode == 2 and as_json.stderr.count("\n") == 1
    found = json.loads(as_json.stdout)
    assert found["table"] == "other" and "holds no epoch" in found["error"]
    assert found["exit_code"] == 2
    nothing_written(simple, before)


def test_a_store_path_that_does_not_exist_is_named_as_such(simple: Setup, tmp_path: Path) -> None:
    before = sink_rows(simple)
    missing = tmp_path / "no-such-store"
    for command in ("verify", "repair"):
        out = cli(command, "--pg", simple.dsn, "--store", str(missing), "--pipeline", "shop",
                  "--table", simple.table, "--json")  # fmt: skip
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert f"no expected-state store at {missing}: the path does not exist" in out.stderr
        assert "holds no epoch" not in out.stderr
        assert "the path does not exist" in json.loads(out.stdout)["error"]
    assert not missing.exists()
    nothing_written(simple, before)


def test_an_unreachable_server_is_not_promised_a_retry(tmp_path: Path) -> None:
    from reconcile.demo.embedded_pg import free_port

    dsn = f"host=127.0.0.1 port={free_port()} dbname=shop user=app password={PASSWORD}"
    out = cli("verify", "--pg", dsn, "--store", str(tmp_path), "--pipeline", "shop",
              "--table", "orders", "--json")  # fmt: skip
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "cannot reach app@127.0.0.1:" in out.stderr and "Connection refused" in out.stderr
    # It exits at once: it must say so, not that it will retry.
    assert "will retry" not in out.stderr and "this command does not retry" in out.stderr
    assert PASSWORD not in out.stderr + out.stdout
    assert json.loads(out.stdout)["error"] in out.stderr


def test_a_store_schema_that_no_longer_matches_names_the_column(simple: Setup) -> None:
    simple.execute("DELETE FROM {t} WHERE id = 3")
    simple.execute("ALTER TABLE {t} ALTER COLUMN total TYPE text")
    before = sink_rows(simple)
    out = cli(*args(simple, "repair", "--mode", "full"))
    assert out.returncode == 2
    assert "column 'total' is text in the sink but int64 in the expected state" in out.stderr
    nothing_written(simple, before)


def test_scoped_mode_without_epoch_says_which_mode_to_use(simple: Setup) -> None:
    simple.execute("ALTER TABLE {t} DROP COLUMN _epoch")
    simple.execute("DELETE FROM {t} WHERE id = 3")
    before = sink_rows(simple)
    out = cli(*args(simple, "repair", "--mode", "scoped"))
    assert out.returncode == 2
    assert "no _epoch column" in out.stderr and "use mode full or buckets" in out.stderr
    nothing_written(simple, before)


def test_a_dsn_that_cannot_connect_is_one_line_with_the_password_redacted(
    pg_server: PgServer, tmp_path: Path
) -> None:
    dsn = pg_server.dsn("postgres", user=PASSWORD_USER, password="wrong-" + PASSWORD)
    url = (
        f"postgresql+psycopg://{PASSWORD_USER}:wrong-{PASSWORD}@127.0.0.1:{pg_server.port}/postgres"
    )
    for target in (dsn, url):
        out = cli("verify", "--pg", target, "--store", str(tmp_path), "--pipeline", "shop",
                  "--table", "orders")  # fmt: skip
        assert out.returncode == 2
        assert out.stderr.count("\n") == 1, out.stderr
        assert "password authentication failed" in out.stderr
        assert PASSWORD not in out.stderr and "wrong-" not in out.stderr


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://app:Hunter Two@127.0.0.1/shop",  # a space: libpq quotes the fragment
        "postgresql://app:Hunter%zzTwo@127.0.0.1/shop",  # a bad percent escape
        "postgresql://app:Hunter@Two@127.0.0.1/shop",  # an unencoded '@': the tail is the host
        "postgresql+psycopg://app:Hunter@Two@127.0.0.1/shop",
        "host=127.0.0.1 password=Hunter Two dbname=shop",
        "host=127.0.0.1 password='Hunter Two dbname=shop",  # an unterminated quote
    ],
)
def test_a_dsn_that_cannot_be_parsed_is_never_echoed(dsn: str, tmp_path: Path) -> None:
    out = cli("verify", "--pg", dsn, "--store", str(tmp_path), "--pipeline", "shop",
              "--table", "orders")  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert "Hunter" not in out.stderr and "Two" not in out.stderr and "Hunter" not in out.stdout
    assert "not shown" in out.stderr
