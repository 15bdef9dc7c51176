"""Full mode in bounded memory: a table many chunks large, verified and repaired exactly.

``chunk_rows`` is set far below the table's size, so both sides are spilled in
parts by key hash and diffed part by part; the counts must equal the in-memory
diff's, the repair must leave the sink equal to the expected state (read from
Postgres and from the store, not from the report), and the spilled parts must
be gone afterwards, after an interruption too.
"""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path

import pytest

from expected_state.parts_reading import SPILLED
from reconcile import recover
from reconcile.core import hooks
from reconcile.recovery.in_parts import PART
from reconcile.recovery.steps import PULLING
from tests.recovery_setup import (
    SIMPLE_DDL,
    SIMPLE_SCHEMA,
    TYPES_DDL,
    TYPES_KEYS,
    TYPES_SCHEMA,
    Setup,
    expected_rows,
    make_setup,
    sink_rows,
    types_row,
)

pytestmark = pytest.mark.integration

COUNTS = ("missing", "extra", "changed")


@pytest.fixture
def wide(pg_db: str, tmp_path: Path) -> Setup:
    """1,500 rows over four epochs: inserts, updates of every third row, deletes."""
    setup = make_setup(pg_db, str(tmp_path), "orders", SIMPLE_SCHEMA, SIMPLE_DDL, ["id"])
    setup.write([{"id": i, "name": f"n{i}", "total": i} for i in range(1200)])
    setup.write([{"id": i, "name": f"u{i}", "total": i + 1} for i in range(0, 1200, 3)])
    setup.write(
        [{"id": i, "name": f"n{i}", "total": i} for i in range(1200, 1500)],
        deletes=[{"id": i} for i in range(1100, 1200)],
    )
    setup.write([{"id": i, "name": f"v{i}", "total": -i} for i in range(0, 1500, 7)])
    return setup


def spread_drift(setup: Setup) -> dict[str, int]:
    """Drift spread thinly over the whole key space, each kind in many parts."""
    deleted = setup.execute("DELETE FROM {t} WHERE id % 97 = 5")
    changed = setup.execute("UPDATE {t} SET name = 'hand' WHERE id % 89 = 1 AND id % 97 <> 5")
    nulled = setup.execute(
        "UPDATE {t} SET total = NULL WHERE id % 131 = 2 AND id % 89 <> 1 AND id % 97 <> 5"
    )
    inserted = setup.execute(
        "INSERT INTO {t} (id, name, total) SELECT g, 'new', g FROM generate_series(5000, 5039) g"
    )
    return {"missing": deleted, "extra": inserted, "changed": changed + nulled}


def counts(report: object) -> dict[str, int]:
    return {k: getattr(report, k) for k in COUNTS}


def test_a_table_of_many_chunks_is_verified_and_repaired_exactly(
    wide: Setup, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    small = {"mode": "full", "chunk_rows": 100, "spill_dir": str(spill)}
    assert not recover(wide.dsn, wide.root, "shop", "orders", dry_run=True, **small).drift
    want = spread_drift(wide)
    assert all(n > 1 for n in want.values()), want
    with hooks.at(PART, lambda: None, times=10**6) as parts, caplog.at_level(logging.INFO):
        verify = recover(wide.dsn, wide.root, "shop", "orders", dry_run=True, **small)
    # The store's files hold 1,200 + 400 + 400 + 215 rows: 23 parts of about 100.
    assert wide.store.stored_rows() == 2215
    assert parts.hits == 23
    assert "full mode: 23 parts" in caplog.text
    whole = recover(wide.dsn, wide.root, "shop", "orders", mode="full", dry_run=True)
    assert counts(verify) == counts(whole) == want
    live = len(expected_rows(wide))
    assert verify.rows_pulled == whole.rows_pulled == live - want["missing"] + want["extra"]
    assert list(spill.iterdir()) == []

    repair = recover(wide.dsn, wide.root, "shop", "orders", **small)
    assert counts(repair) == want and repair.applied == sum(want.values())
    assert sink_rows(wide) == expected_rows(wide)
    assert wide.scalar(
        "SELECT array[missing, extra, changed, applied] FROM reconcile.reconcile_repairs"
    ) == [want["missing"], want["extra"], want["changed"], sum(want.values())]
    assert not recover(wide.dsn, wide.root, "shop", "orders", **small).drift
    assert list(spill.iterdir()) == []


def test_several_key_columns_and_every_type_in_parts(pg_db: str, tmp_path: Path) -> None:
    setup = make_setup(pg_db, str(tmp_path), "ledger", TYPES_SCHEMA, TYPES_DDL, TYPES_KEYS)
    rng = random.Random(11)
    rows = [types_row(rng) for _ in range(300)]
    setup.write(rows[:200])
    setup.write([*rows[200:], dict(rows[0], note="changed", qty=None)], deletes=[rows[1]])
    setup.execute("DELETE FROM {t} WHERE id IN (%s, %s)", rows[5]["id"], rows[250]["id"])
    setup.execute("UPDATE {t} SET note = 'hand' WHERE id = %s", rows[7]["id"])
    setup.execute("UPDATE {t} SET amount = NULL, flag = NULL WHERE id = %s", rows[201]["id"])
    # The same uuid under another region: a key that differs in its first column only.
    setup.execute("INSERT INTO {t} (region, id) VALUES ('zz', %s)", rows[9]["id"])
    with hooks.at(PART, lambda: None, times=10**6) as parts:
        verify = recover(setup.dsn, setup.root, "shop", "ledger", mode="full", dry_run=True,
                         chunk_rows=13)  # fmt: skip
    assert parts.hits > 20
    whole = recover(setup.dsn, setup.root, "shop", "ledger", mode="full", dry_run=True)
    assert counts(verify) == counts(whole) == {"missing": 2, "extra": 1, "changed": 2}
    repair = recover(setup.dsn, setup.root, "shop", "ledger", mode="full", chunk_rows=13)
    assert repair.applied == 5
    assert sink_rows(setup) == expected_rows(setup)


def test_an_interruption_between_parts_writes_nothing_and_leaves_no_spill(
    wide: Setup, tmp_path: Path
) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    spread_drift(wide)
    before = sink_rows(wide)

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    with hooks.at(PART, ctrl_c, nth=7) as armed, pytest.raises(KeyboardInterrupt):
        recover(wide.dsn, wide.root, "shop", "orders", mode="full", chunk_rows=100,
                spill_dir=str(spill))  # fmt: skip
    assert armed.fired == 1
    assert list(spill.iterdir()) == []
    assert sink_rows(wide) == before
    assert wide.scalar("SELECT count(*) FROM reconcile.reconcile_repairs") == 0


def test_chunk_rows_must_be_a_positive_number(wide: Setup) -> None:
    from reconcile.core.contract import ConfigurationError

    for bad in (0, -5, True, 2.5):
        with pytest.raises(ConfigurationError, match="chunk_rows"):
            recover(wide.dsn, wide.root, "shop", "orders", mode="full", chunk_rows=bad)


def test_the_store_is_read_while_the_sink_is_pulled(wide: Setup, tmp_path: Path) -> None:
    spilled, seen = threading.Event(), []

    def store_spilled() -> None:
        seen.append(threading.current_thread())
        spilled.set()

    def pull_starts() -> None:
        # The pull waits here until the store's files are read: they are read meanwhile.
        seen.append(spilled.wait(30))

    small = {"mode": "full", "chunk_rows": 100, "spill_dir": str(tmp_path)}
    with hooks.at(SPILLED, store_spilled) as store, hooks.at(PULLING, pull_starts) as pull:
        report = recover(wide.dsn, wide.root, "shop", "orders", dry_run=True, **small)
    assert store.fired == pull.fired == 1
    reader, read_meanwhile = seen
    assert read_meanwhile is True and reader is not threading.main_thread()
    assert not report.drift and report.rows_pulled == len(expected_rows(wide))


def test_a_pull_that_fails_leaves_no_spill_of_either_side(wide: Setup, tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()

    def lost() -> None:
        raise ConnectionError("the server closed the connection")

    with hooks.at(PULLING, lost) as armed, pytest.raises(ConnectionError, match="closed") as err:
        recover(wide.dsn, wide.root, "shop", "orders", mode="full", chunk_rows=100,
                spill_dir=str(spill))  # fmt: skip
    assert armed.fired == 1
    # Removed on the way out, not when the traceback (still held here) lets go of it.
    assert list(spill.iterdir()) == [] and err.traceback
    assert not [t for t in threading.enumerate() if t.name == "reconcile-read-ahead"]
