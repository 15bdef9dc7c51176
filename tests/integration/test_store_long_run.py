"""A writer that runs for days: what it keeps per epoch follows the kept window, not its age.

The store keeps, per object, the epoch -> version map and each epoch's change
files (read from the log's commitInfo), the log entry of every file it audits,
and the files whose footers it checked. ``vacuum()`` prunes the log below the
epochs it keeps; the writer then forgets what only the pruned versions knew,
so that it holds what a reader opened now holds, whatever number of epochs it
wrote before (a day at one epoch a second is 86,400). Each case runs on a real
Delta table on disk, with ``maintain()`` after every epoch as a pipeline runs it.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from expected_state.store import ExpectedStateStore
from reconcile.core.contract import Change, EpochOrderError, InvalidInputError

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
EPOCHS = 120
# maintain() as a pipeline calls it, with smaller thresholds so that a short run
# merges, vacuums and checkpoints often: a merge (and a vacuum) every 8 epochs.
MAINTAIN = {
    "checkpoint_every": 4,
    "compact_changes_after": 8,
    "retention_hours": 0,
    "safety_margin_minutes": 0,
}


def store_at(root: Path) -> ExpectedStateStore:
    return ExpectedStateStore(str(root), "pipe", "t", ["k"], schema=SCHEMA)


def epoch_changes(e: int) -> list[Change]:
    """A new key and an update of an older one, as the store-day benchmark's epochs."""
    return [
        Change("upsert", {"k": f"k{e}", "v": e}),
        Change("upsert", {"k": f"k{e // 2}", "v": -e}),
    ]


def as_map(table: pa.Table) -> dict[str, int]:
    return {r["k"]: r["v"] for r in table.to_pylist()}


def test_a_long_lived_writer_holds_the_kept_window_as_a_reader_opened_now(
    tmp_path: Path,
) -> None:
    writer = store_at(tmp_path)
    states: dict[int, dict[str, int]] = {}
    for e in range(1, EPOCHS + 1):
        writer.apply(e, epoch_changes(e))
        writer.maintain(keep_from_epoch=e - 1, **MAINTAIN)
        states[e] = as_map(writer.snapshot())
    reader = store_at(tmp_path)
    reader.audit()
    kept = reader.epoch_versions()
    # The log was pruned: a reader opened now lists a window of the newest epochs.
    assert 1 < len(kept) < EPOCHS // 4 and max(kept) == EPOCHS
    # The writer that wrote every epoch holds that same window, not every epoch.
    assert writer.epoch_versions() == kept
    assert set(writer._epoch_files) == set(kept)
    writer.audit()
    assert writer._log_audit is not None and reader._log_audit is not None
    assert writer._log_audit.entries == reader._log_audit.entries
    assert writer._sound_files <= set(writer._log_audit.entries)
    # What is kept still works: time travel, the changes since a kept epoch,
    # replays of kept epochs; an epoch before the window is refused as pruned,
    # as the reader refuses it.
    first = min(kept)
    for e in kept:
        assert as_map(writer.snapshot(e)) == states[e]
    assert writer.changed_keys(first).num_rows == reader.changed_keys(first).num_rows > 0
    assert not writer.apply(EPOCHS, epoch_changes(EPOCHS)).applied
    assert not writer.apply(first, epoch_changes(first)).applied
    for store in (writer, reader):
        with pytest.raises(EpochOrderError, match="older than the log vacuum kept"):
            store.apply(1, epoch_changes(1))
        with pytest.raises(InvalidInputError, match="files of epoch 1 are gone"):
            store.snapshot(1)
    assert writer.apply(EPOCHS + 1, epoch_changes(EPOCHS + 1)).applied
    assert as_map(writer.snapshot()) == {**states[EPOCHS], "k121": 121, "k60": -121}
