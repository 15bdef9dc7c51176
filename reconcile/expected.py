"""The expected state of a pipeline's sink tables, as the commit cycle records and replays it.

One :class:`ExpectedStateStore` per sink that has one (a sink table with key
columns), all under one store root, plus the store's progress log (its epochs
table), which then is the pipeline's progress log: no separate progress file.

The cycle records each epoch's outputs here at the commit point, then writes
the decision; see ``CommitCycle`` for the order and what recovery does with it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.contract import (
    Change,
    ConfigurationError,
    InvalidInputError,
    ReconcileError,
    validate_name,
)
from reconcile.staged import StagedEpoch

if TYPE_CHECKING:  # the store (deltalake) is imported when an expected state is built
    from expected_state.store import ExpectedStateStore

__all__ = ["ExpectedState", "ReplayRows", "as_changes", "replay_rows"]

OP_COLUMN = "_op"

log = logging.getLogger("reconcile.expected")


def as_changes(sink: str, rows: Iterable[Any]) -> list[Change] | pa.Table:
    """A sink's outputs as store changes: dicts are upserts, Changes stay, Arrow gets ``_op``.

    Raises:
        InvalidInputError: an item that is no row, naming the sink and its index.
    """
    if isinstance(rows, pa.Table):
        if OP_COLUMN in rows.column_names:
            return rows
        return rows.append_column(OP_COLUMN, pa.array(["upsert"] * rows.num_rows, pa.string()))
    changes: list[Change] = []
    for index, item in enumerate(rows):
        if isinstance(item, Change):
            changes.append(item)
        elif isinstance(item, Mapping):
            changes.append(Change("upsert", item))
        else:
            raise InvalidInputError(
                f"sink {sink!r}: output {index} is a {type(item).__name__}, not a row (a dict), "
                "a Change or an Arrow table; nothing was written",
                sink=sink,
            )
    return changes


class ExpectedState:
    """The expected state of one pipeline: a store table per keyed sink, and the progress log.

    Args:
        root: the store root (a local path or a URI deltalake understands).
        pipeline: the pipeline's name.
        keys: sink name -> its key columns. Sinks not listed have no expected
            state (they are not pulled and diffed; an epoch they lack after a
            crash is replayed from the outputs, as without a store).
        schemas: sink name -> the user schema (keys and values), optional; by
            default the table's, or inferred from its first epoch.
    """

    def __init__(
        self,
        root: str,
        pipeline: str,
        keys: Mapping[str, Sequence[str]],
        *,
        schemas: Mapping[str, pa.Schema] | None = None,
    ) -> None:
        from expected_state.progress_log import StoreProgressLog

        self.root = str(root)
        self.pipeline = validate_name("pipeline", pipeline)
        if not keys:
            raise ConfigurationError(
                f"pipeline {pipeline!r}: an expected state needs the key columns of at least "
                "one sink (keys={'<sink>': ['<column>', ...]})"
            )
        self.keys = {validate_name("sink", s): list(k) for s, k in keys.items()}
        self.schemas = dict(schemas or {})
        self.progress = StoreProgressLog(self.root, pipeline)
        self.tables: dict[str, ExpectedStateStore] = {}
        self._open(generation=0)

    def _open(self, *, generation: int) -> None:
        from expected_state.store import ExpectedStateStore

        self.tables = {
            sink: ExpectedStateStore(
                self.root,
                self.pipeline,
                sink,
                key_columns,
                schema=self.schemas.get(sink),
                generation=generation,
            )
            for sink, key_columns in self.keys.items()
        }

    def check_sinks(self, sinks: Iterable[str]) -> None:
        """Every keyed name must be a sink of the pipeline (a typo would record nothing)."""
        unknown = sorted(set(self.keys) - set(sinks))
        if unknown:
            raise ConfigurationError(
                f"pipeline {self.pipeline!r}: expected state for {unknown}, which are not its "
                f"sinks ({sorted(sinks)})"
            )

    def claim(self, generation: int) -> None:
        """Write as ``generation`` from now on, fencing older writers in every table.

        A table that does not exist yet is claimed by its first ``apply``.
        """
        self._open(generation=generation)
        for store in self.tables.values():
            if store.user_schema is not None:
                store.claim()

    def record(self, epoch: int, outputs: Mapping[str, Iterable[Any]]) -> None:
        """Record ``epoch``'s outputs in every table (idempotent: a recorded epoch is kept).

        Raises:
            InvalidInputError, FencedError, RetryableError, OutcomeUnknownError:
                from the store (see ExpectedStateStore.apply).
        """
        for sink, store in self.tables.items():
            rows = outputs.get(sink, ())
            if isinstance(rows, StagedEpoch):
                # Executors wrote the change files: add them, read nothing.
                store.apply_parts(epoch, rows.store_files, upserted=rows.upserted,
                                  deleted=rows.deleted, allow_gap=True)  # fmt: skip
            else:
                store.apply(epoch, as_changes(sink, rows), allow_gap=True)

    def revert_undecided(self, decided: int | None) -> list[tuple[str, int]]:
        """Undo what ``record`` wrote for an epoch past ``decided`` (never decided).

        Epochs run in order and one at a time, so only each table's newest
        epoch can be undecided. Returns the (sink, epoch) pairs reverted.
        """
        reverted = []
        for sink, store in self.tables.items():
            last = store.last_epoch()
            if last is not None and (decided is None or last > decided):
                store.revert(last)
                reverted.append((sink, last))
        return reverted

    def maintain(self, verified_epoch: int) -> dict[str, dict[str, Any]]:
        """The store's housekeeping that is due, table by table (between epochs).

        Merge-on-read keeps an epoch's cost in proportion to its own rows only
        if the change files and the Delta log are folded and pruned now and
        then (``ExpectedStateStore.maintain``: cheap when nothing is due). The
        change files from ``verified_epoch`` on are kept, which scoped recovery
        and bucket summaries read. A failure is logged, never raised: the epoch
        it follows is committed in every sink, and the next call tries again.
        """
        done: dict[str, dict[str, Any]] = {}
        for sink, store in self.tables.items():
            if store.user_schema is None:
                continue
            try:
                done[sink] = store.maintain(keep_from_epoch=verified_epoch)
            except ReconcileError as exc:
                log.warning("pipeline %s: housekeeping of the expected state of %s deferred: %s",
                            self.pipeline, sink, exc)  # fmt: skip
        return done

    def changes_of(self, sink: str, epoch: int) -> pa.Table:
        """The changes recorded for ``sink`` in ``epoch`` (what its sink must receive)."""
        return self.tables[sink].changes_of(epoch)


def replay_rows(changes: pa.Table, keys: Sequence[str]) -> list[Any]:
    """Recorded changes as rows a sink stages: upserts as dicts, deletes as Changes."""
    ops = changes.column(OP_COLUMN).to_pylist()
    data = changes.drop_columns([OP_COLUMN]).to_pylist()
    rows: list[Any] = []
    for op, row in zip(ops, data, strict=True):
        if op == "delete":
            rows.append(Change("delete", {k: row[k] for k in keys}))
        else:
            rows.append(row)
    return rows


class ReplayRows(Mapping[str, Iterable[Any]]):
    """What a sink is given when an epoch past the commit point must be written again.

    For a sink with an expected state: the changes RECORDED for the epoch (the
    run that reached the decision), read only when a sink needs them. For the
    others: the outputs at hand, if any (a recomputed run; they have no record).
    """

    def __init__(
        self,
        expected: ExpectedState | None,
        epoch: int,
        outputs: Mapping[str, Iterable[Any]] | None,
    ) -> None:
        self.expected, self.epoch, self.outputs = expected, epoch, outputs
        self._names = set(outputs or {}) | set(expected.tables if expected else {})

    # A sink missing from a plain outputs mapping has an empty batch; here a
    # sink with neither a record nor outputs at hand has nothing to replay.
    strict = True

    def __getitem__(self, sink: str) -> Iterable[Any]:
        if self.expected is not None and sink in self.expected.tables:
            store = self.expected.tables[sink]
            return replay_rows(store.changes_of(self.epoch), store.key_columns)
        if self.outputs is None:
            raise KeyError(sink)
        return self.outputs.get(sink, ())

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names))

    def __len__(self) -> int:
        return len(self._names)
