"""The store checks itself before its rows are trusted: its commits, and the files a read uses.

Every commit the engine writes is trusted (applies, reverts, claims, both
compactions, vacuum, checkpoints); a commit someone else wrote that adds,
removes or re-describes a data file is refused, unless it was undone; a file
whose footer no longer matches its log entry is refused. Each case is made on
a real Delta table on disk, and checked against the table's own log.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

import expected_state.trust as trust
from expected_state.integrity import LogEntry
from expected_state.layout import StoreFile
from expected_state.store import ExpectedStateStore
from reconcile.core.contract import Change, StoreIntegrityError, StoreLostRowsError

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])


def store_at(root: Path, generation: int = 0) -> ExpectedStateStore:
    return ExpectedStateStore(str(root), "pipe", "t", ["k"], schema=SCHEMA, generation=generation)


def fresh(root: Path) -> ExpectedStateStore:
    """A new store object: it audits the log from its start, as a CLI repair does."""
    return ExpectedStateStore(str(root), "pipe", "t", ["k"])


def filled(root: Path, epochs: int = 6) -> ExpectedStateStore:
    store = store_at(root)
    for e in range(epochs):
        store.apply(e, [Change("upsert", {"k": e * 10 + i, "v": e}) for i in range(10)])
    return store


def log_files(store: ExpectedStateStore) -> list[str]:
    return sorted(p.name for p in (Path(store.uri) / "_delta_log").iterdir())


def test_every_commit_the_engine_writes_is_trusted(tmp_path: Path) -> None:
    store = filled(tmp_path)
    store.apply(6, [Change("delete", {"k": 1})])
    assert store.revert(6)
    store.apply(6, [Change("upsert", {"k": 1, "v": 99})])
    store.compact_changes(through_epoch=3)
    store.compact(through_epoch=4)
    store.checkpoint()
    newer = store_at(tmp_path, generation=1)
    newer.claim()
    newer.apply(7, [Change("upsert", {"k": 500, "v": 7})])
    newer.vacuum(retention_hours=0, safety_margin_minutes=0, keep_epochs=1)  # prunes the log
    newer.maintain(checkpoint_every=1)
    reader = fresh(tmp_path)
    reader.audit()
    state = reader.snapshot()
    assert state.num_rows == 61 and reader.changes_of(7).num_rows == 1
    reader.check_version(DeltaTable(reader.uri).version())
    # The audit of the pruned log started from the checkpoint vacuum kept.
    assert reader._log_audit is not None and reader._log_audit.start > 0


def test_a_foreign_delete_is_lost_rows_until_it_is_restored(tmp_path: Path) -> None:
    store = filled(tmp_path)
    DeltaTable(store.uri).delete("k >= 20")
    version = DeltaTable(store.uri).version()
    reader = fresh(tmp_path)
    for read in (reader.snapshot, lambda: reader.changed_keys(0), lambda: reader.changes_of(3)):
        with pytest.raises(StoreLostRowsError, match=f"lost rows.*version {version} \\(DELETE\\)"):
            read()
    with pytest.raises(StoreLostRowsError) as err:
        fresh(tmp_path).audit()
    assert err.value.details["lost_epochs"] == ["2", "3", "4", "5"]
    assert err.value.details["foreign_commits"] == [version]
    assert f"restore the table to version {version - 1}" in str(err.value)
    # The writer's own maintenance refuses too: vacuum would prune the evidence.
    before = log_files(store)
    with pytest.raises(StoreLostRowsError):
        store.vacuum(retention_hours=0, safety_margin_minutes=0, keep_epochs=1)
    assert log_files(store) == before
    DeltaTable(store.uri).restore(version - 1)
    assert fresh(tmp_path).snapshot().num_rows == 60


def test_a_foreign_append_or_optimize_is_refused_naming_the_files(tmp_path: Path) -> None:
    store = filled(tmp_path)
    extra = pa.table({"k": [1000], "v": [1], "_row_hash": [0], "_epoch": [5], "_op": ["upsert"]})
    write_deltalake(store.uri, extra, mode="append", schema_mode="merge")
    with pytest.raises(
        StoreIntegrityError, match=r"holds 1 file.* the engine did not write"
    ) as err:
        fresh(tmp_path).snapshot()
    assert not isinstance(err.value, StoreLostRowsError)
    assert len(err.value.details["foreign_files"]) == 1
    DeltaTable(store.uri).optimize.compact()  # rewrites the engine's files into one of its own
    with pytest.raises(StoreLostRowsError, match=r"\(OPTIMIZE\)"):
        fresh(tmp_path).snapshot()


def test_only_this_tables_own_writer_ids_are_trusted(tmp_path: Path) -> None:
    from deltalake import CommitProperties

    from expected_state.progress_log import progress_fence_id

    # A commit carrying the engine's label of another of its writers (a
    # sibling table's token or fence, another pipeline's table, the progress
    # log, the rebuild log) is someone else's commit here: its file is refused.
    labels = ("pipe/u", "pipe/u#generation", "other/t", "other/t#generation",
              progress_fence_id("pipe"), "pipe#rebuilds", "pipe/t#rebuild", "pipe")  # fmt: skip
    for label in labels:
        root = tmp_path / label.replace("/", "_").replace("#", "_")
        store = filled(root, epochs=2)
        extra = pa.table({"k": [1000], "v": [1], "_row_hash": [0], "_epoch": [1],
                          "_op": ["upsert"]})  # fmt: skip
        write_deltalake(store.uri, extra, mode="append", schema_mode="merge",
                        commit_properties=CommitProperties(
                            custom_metadata={"reconcile.app_id": label}))  # fmt: skip
        assert DeltaTable(store.uri).history(1)[0]["reconcile.app_id"] == label
        with pytest.raises(StoreIntegrityError, match=r"holds 1 file.* the engine did not write"):
            fresh(root).snapshot()


def test_a_foreign_commit_that_changes_no_data_file_is_accepted(tmp_path: Path) -> None:
    store = filled(tmp_path)
    DeltaTable(store.uri).alter.set_table_properties({"delta.appendOnly": "false"})
    DeltaTable(store.uri).vacuum(retention_hours=0, enforce_retention_duration=False)
    assert fresh(tmp_path).snapshot().num_rows == 60


def test_compaction_never_folds_a_damaged_file_into_the_truth(tmp_path: Path) -> None:
    store = filled(tmp_path)
    files = sorted(Path(store.uri).glob("change-e*.parquet"))
    pq.write_table(pq.read_schema(files[2]).empty_table(), files[2])
    version = DeltaTable(store.uri).version()
    for compaction in (lambda: store.compact_changes(through_epoch=4), store.compact):
        with pytest.raises(StoreLostRowsError, match=f"{files[2].name} \\(epoch 2\\) holds"):
            compaction()
        assert DeltaTable(store.uri).version() == version  # nothing committed


def test_a_file_replaced_by_one_of_the_same_size_and_row_count_is_refused(
    tmp_path: Path,
) -> None:
    # The same values under other keys: epochs 3 and 4 write files of one size,
    # the same row count and the same _row_hash bounds. Only the epochs they
    # hold (in the footer's statistics) tell them apart.
    store = store_at(tmp_path)
    for e in range(6):
        store.apply(e, [Change("upsert", {"k": e * 10 + i, "v": i}) for i in range(10)])
    files = sorted(Path(store.uri).glob("change-e*.parquet"))
    assert files[3].stat().st_size == files[4].stat().st_size
    files[3].write_bytes(files[4].read_bytes())
    with pytest.raises(StoreLostRowsError, match=r"\(epoch 3\) holds epochs \(4, 4\)"):
        fresh(tmp_path).snapshot()


def test_a_file_is_checked_once_and_only_the_files_a_read_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    filled(tmp_path)
    checked: list[str] = []
    real = trust.check_footer

    def counting(uri: str, file: StoreFile, entry: LogEntry | None) -> str | None:
        checked.append(Path(file.path).name[:20])  # "change-e<epoch>"
        return real(uri, file, entry)

    monkeypatch.setattr(trust, "check_footer", counting)
    reader = fresh(tmp_path)
    reader.changed_keys(3)
    assert checked == ["change-e000000000004", "change-e000000000005"]
    reader.snapshot()
    reader.snapshot()
    assert len(checked) == 6 and len(set(checked)) == 6  # each file once


def test_check_version_refuses_what_a_spark_reader_would_read(tmp_path: Path) -> None:
    store = filled(tmp_path)
    files = sorted(Path(store.uri).glob("change-e*.parquet"))
    files[5].write_bytes(files[5].read_bytes()[:100])  # torn: not Parquet any more
    reader = fresh(tmp_path)
    with pytest.raises(StoreLostRowsError, match=r"epoch 5.*cannot be read as Parquet"):
        reader.check_version(reader.version_of(5))
    reader.check_version(reader.version_of(4))  # that version's files are sound
