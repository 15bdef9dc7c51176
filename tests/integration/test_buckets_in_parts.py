"""Buckets mode's first search in bounded memory: a store many chunks large, checked exactly.

With no kept summary, the search needs every expected row's first key and row
checksum. With ``chunk_rows`` far below the table's size, the snapshot is read
in parts, only those two columns are kept, and the rows of the ranges that
differ are read by range; the counts must equal full mode's, the repair must
leave the sink equal to the store (read from Postgres), and no read of the
whole snapshot may happen on the way.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pytest

from expected_state.store import ExpectedStateStore
from reconcile.core import hooks
from reconcile.recovery.bucket_parts import FIGURES_PART
from reconcile.recovery.buckets import BucketLimits
from reconcile.recovery.engine import reconcile_table
from reconcile.recovery.modes import Mode
from reconcile.recovery.options import RecoverOptions
from reconcile.recovery.report import ReconcileReport
from reconcile.recovery.summary import load_summary
from sinks.postgres.sink import PostgresSink
from tests.integration.test_recover_in_parts import COUNTS, spread_drift, wide  # noqa: F401
from tests.recovery_setup import Setup, expected_rows, make_setup, sink_rows

pytestmark = pytest.mark.integration

# Cut fine enough that the search goes deeper than its first level, and never
# gives way to full mode: the drift is spread over many ranges.
LIMITS = BucketLimits(first_level=128, fanout=4, leaf_rows=4, full_share=1.0)


def check(setup: Setup, options: RecoverOptions, root: str | None = None) -> ReconcileReport:
    sink = PostgresSink(setup.dsn, "orders", name="orders", key=setup.keys)
    try:
        store = ExpectedStateStore(root or setup.root, setup.pipeline, "orders", setup.keys)
        target = sink.recovery_target(setup.pipeline, None, write=not options.dry_run)
        return reconcile_table(target, store, options, bucket_options=LIMITS)
    finally:
        sink.close()


def counts(report: ReconcileReport) -> dict[str, int]:
    return {k: getattr(report, k) for k in COUNTS}


def test_a_first_bucket_search_of_many_chunks_repairs_exactly(
    wide: Setup,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    want = spread_drift(wide)
    full = check(wide, RecoverOptions(mode=Mode.FULL, dry_run=True))
    assert counts(full) == want
    whole_reads: list[Any] = []
    snapshot = ExpectedStateStore.snapshot

    def watched(self: ExpectedStateStore, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("keys") is None and kwargs.get("ranges") is None:
            whole_reads.append((args, kwargs))
        return snapshot(self, *args, **kwargs)

    monkeypatch.setattr(ExpectedStateStore, "snapshot", watched)
    spill = tmp_path / "spill"
    spill.mkdir()
    small = RecoverOptions(mode=Mode.BUCKETS, chunk_rows=100, spill_dir=str(spill))
    with hooks.at(FIGURES_PART, lambda: None, times=10**6) as parts:
        repair = check(wide, small)
    # The store's files hold 2,215 rows: 23 parts of about 100.
    assert parts.hits == 23
    assert whole_reads == []  # neither the search nor the repair read every row at once
    assert counts(repair) == want and repair.applied == sum(want.values())
    assert repair.mode == "buckets" and repair.buckets_differing > 0, repair.reason
    assert repair.buckets_compared > LIMITS.first_level  # it cut deeper than the first level
    assert repair.rows_pulled < len(expected_rows(wide)) // 2
    assert sink_rows(wide) == expected_rows(wide)
    assert list(spill.iterdir()) == []
    assert counts(check(wide, RecoverOptions(mode=Mode.FULL, dry_run=True))) == dict.fromkeys(
        COUNTS, 0
    )


def test_the_parts_cut_the_same_ranges_as_the_rows_read_whole(
    wide: Setup,  # noqa: F811
    tmp_path: Path,
) -> None:
    spread_drift(wide)
    # A copy of the store for each: a first search keeps a summary that the next would use.
    twin = tmp_path / "twin"
    shutil.copytree(wide.root, twin)
    in_parts = check(wide, RecoverOptions(mode=Mode.BUCKETS, dry_run=True, chunk_rows=100))
    whole = check(wide, RecoverOptions(mode=Mode.BUCKETS, dry_run=True), str(twin))
    assert counts(in_parts) == counts(whole)
    assert (in_parts.buckets_compared, in_parts.buckets_differing) == (
        whole.buckets_compared,
        whole.buckets_differing,
    )
    assert in_parts.rows_pulled == whole.rows_pulled


def test_a_store_whose_every_key_was_deleted_finds_every_sink_row_extra(
    wide: Setup,  # noqa: F811
) -> None:
    keys = [{"id": i} for i in range(1500)]
    wide.write([], deletes=keys)
    assert wide.store.stored_rows() > 100 and expected_rows(wide) == {}
    held = wide.execute(
        "INSERT INTO {t} (id, name, total) SELECT g, 'new', g FROM generate_series(1, 40) g"
    )
    assert held == 40
    found = check(wide, RecoverOptions(mode=Mode.BUCKETS, dry_run=True, chunk_rows=100))
    assert counts(found) == {"missing": 0, "extra": held, "changed": 0}


def test_a_first_search_in_parts_keeps_the_summary_the_rows_read_whole_give(
    wide: Setup,  # noqa: F811
    tmp_path: Path,
) -> None:
    # The figures in parts are added up range by range as each part is read;
    # every key is a bound's value or between two, and a row AT a bound belongs
    # to the range it opens (width_bucket's numbering, as the database counts).
    spread_drift(wide)
    twin = tmp_path / "twin"
    shutil.copytree(wide.root, twin)
    in_parts = check(wide, RecoverOptions(mode=Mode.BUCKETS, dry_run=True, chunk_rows=100))
    whole = check(wide, RecoverOptions(mode=Mode.BUCKETS, dry_run=True), str(twin))
    assert counts(in_parts) == counts(whole)
    columns = (("id", "int"), ("name", "text"), ("total", "int"))
    kept = [
        load_summary(ExpectedStateStore(root, wide.pipeline, "orders", wide.keys), columns, "id")
        for root in (wide.root, str(twin))
    ]
    parts, read_whole = kept
    assert parts is not None and read_whole is not None
    assert len(parts.bounds) == LIMITS.first_level - 1
    assert parts.bounds == read_whole.bounds
    assert parts.rows.tolist() == read_whole.rows.tolist()
    assert parts.sums.tolist() == read_whole.sums.tolist()
    assert int(parts.rows.sum()) == len(expected_rows(wide))


def test_a_text_first_key_in_parts_keeps_the_summary_the_rows_read_whole_give(
    pg_db: str, tmp_path: Path
) -> None:
    # A first key that is not an integer is sorted by Arrow (byte order), as
    # the rows read whole are: the same bounds, the same figures.
    schema = pa.schema([("code", pa.string()), ("id", pa.int64()), ("total", pa.int64())])
    ddl = "CREATE TABLE {} (code text PRIMARY KEY, id bigint, total bigint, _epoch bigint)"
    setup = make_setup(pg_db, str(tmp_path / "store"), "orders", schema, ddl, ["code"])
    codes = [f"{'é' if i % 5 == 0 else 'k'}{i * 7919 % 1500:04d}" for i in range(1500)]
    setup.write([{"code": c, "id": i, "total": i} for i, c in enumerate(codes)])
    setup.write([{"code": c, "id": i, "total": -i} for i, c in enumerate(codes) if i % 3 == 0])
    hand = setup.execute("UPDATE {t} SET total = 0 WHERE id % 101 = 4")
    twin = tmp_path / "twin"
    shutil.copytree(setup.root, twin)
    in_parts = check(setup, RecoverOptions(mode=Mode.BUCKETS, dry_run=True, chunk_rows=100))
    whole = check(setup, RecoverOptions(mode=Mode.BUCKETS, dry_run=True), str(twin))
    assert counts(in_parts) == counts(whole) == {"missing": 0, "extra": 0, "changed": hand}
    columns = (("code", "text"), ("id", "int"), ("total", "int"))
    parts, read_whole = (
        load_summary(ExpectedStateStore(root, setup.pipeline, "orders", ["code"]), columns, "code")
        for root in (setup.root, str(twin))
    )
    assert parts is not None and read_whole is not None
    assert len(parts.bounds) == LIMITS.first_level - 1
    assert any(b.startswith("é") for b in parts.bounds)
    assert parts.bounds == read_whole.bounds
    assert parts.rows.tolist() == read_whole.rows.tolist()
    assert parts.sums.tolist() == read_whole.sums.tolist()
