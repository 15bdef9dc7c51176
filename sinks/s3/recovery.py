"""Pull-and-diff on the file sink on S3: the log's batches folded into rows; a repair, one entry.

What the sink holds is what its log says: the batches of its commit and
repair entries, read in log order, each line an upsert of its row's key (or,
``"_op": "delete"``, the key's removal), the last one of a key winning. A
pull folds exactly the entries up to the log's end when it began: objects
are never rewritten, so later commits cannot change what it reads.

Rows are JSON, so the sink has no schema of its own: every column the
expected state names may be in its rows (a row without it holds NULL there),
and each value is converted to the expected state's type as it is read. A
value that does not convert is drift (the row is flagged, never dropped).

A repair is one batch object under ``repairs/`` and one ``repair`` entry in
the log, appended by the log's conditional put with two checks on the state
it follows: the pipeline's fence (a stale generation is refused), and that
the log's end is still the pulled snapshot's. A commit that landed since the
pull makes the put's check fail: nothing is written and the caller pulls
again, as a moved marker does on the database sinks.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.conform import SinkColumn, values_to_arrow
from reconcile.core.contract import (
    ConfigurationError,
    FatalError,
    FencedError,
    InvalidInputError,
    Retryable,
    SinkOutcome,
)
from reconcile.core.target import NoRowChecksums, Progress, Repair
from sinks.files.layout import DELETE, OP, parse_header
from sinks.s3.log import LogState

if TYPE_CHECKING:
    from sinks.s3.sink import S3FileSink

__all__ = ["JSON_KIND", "S3RecoveryTarget"]

# A column of a JSON batch: any value, converted to the expected state's type as read.
JSON_KIND = "json"
_REPAIRS = "repairs/"


class _AnyColumn(dict[str, SinkColumn]):
    """The columns of a schemaless sink: whatever the expected state names is there."""

    def get(self, name: str, default: Any = None) -> SinkColumn:
        return SinkColumn(name, JSON_KIND, "a JSON value")


def _to_arrow(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (dicts) in the expected state's types; a value that does not fit is flagged."""
    return values_to_arrow([[row.get(f.name) for row in rows] for f in schema], schema)


class _Snapshot(NoRowChecksums):
    """The sink as of one log end (the protocol ``SinkSnapshot``)."""

    system = "S3"
    target: S3RecoveryTarget
    modes = "full"

    def __init__(self, target: S3RecoveryTarget, state: LogState, schema: pa.Schema,
                 keys: list[str]) -> None:  # fmt: skip
        self.target, self.schema, self.keys = target, schema, keys
        self.end = state.end
        self.entries = state.batches()
        self.newest_epoch = state.newest(target.pipeline, target.sink.name)
        self.warnings: list[str] = []
        # Every pull reads the whole log: there is no index to narrow a range with.
        self.narrow_ranges = False
        self._rows: dict[tuple[Any, ...], dict[str, Any]] | None = None
        # key -> the epoch of the entry whose line the key's row is (its ``_epoch``).
        self._epochs: dict[tuple[Any, ...], int] = {}

    def _fold(self, progress: Progress | None) -> dict[tuple[Any, ...], dict[str, Any]]:
        """key -> the row the sink holds for it: every batch in log order, the last line winning."""
        if self._rows is not None:
            return self._rows
        bucket = self.target.sink.bucket
        rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        epochs = self._epochs
        for _seq, batch, epoch in self.entries:
            body = bucket.get(batch)
            where = bucket.uri(batch)
            if body is None:
                raise FatalError(
                    f"{where}: the log names this batch, which is gone (removed by hand?); the "
                    "sink's content cannot be read",
                    path=where,
                )
            lines = body.split(b"\n")
            try:
                parse_header(lines[0], where)
                for number, line in enumerate(lines[1:], start=2):
                    if not line:
                        continue
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise ValueError(f"line {number} is not a JSON object")
                    missing = [k for k in self.keys if k not in row]
                    if missing:
                        raise ValueError(f"line {number} lacks key column(s) {missing}")
                    key = tuple(row[k] for k in self.keys)
                    # Deletes and upserts in order: the last line of a key wins.
                    if row.pop(OP, None) == DELETE:
                        rows.pop(key, None)
                        epochs.pop(key, None)
                    else:
                        rows[key] = row
                        epochs[key] = epoch
            except ValueError as exc:
                raise FatalError(f"{where}: unreadable batch: {exc}", path=where) from exc
            if progress is not None:
                progress(len(rows), None)
        self._rows = rows
        return rows

    def pull_all(self, progress: Progress | None) -> pa.Table:
        return _to_arrow(list(self._fold(progress).values()), self.schema)

    def pull_each(self, each: Callable[[pa.Table], None], progress: Progress | None) -> None:
        # The fold must see every batch before any row is final: it is done
        # whole, then handed on in slices (the rows are already in memory).
        rows = list(self._fold(progress).values())
        for start in range(0, len(rows), 65_536):
            each(_to_arrow(rows[start : start + 65_536], self.schema))

    def estimated_rows(self) -> int | None:
        return None if self._rows is None else len(self._rows)

    def pull_keys(self, keys: pa.Table, newer_than: int) -> pa.Table:
        """The rows of ``keys``, and those an entry past ``newer_than`` wrote.

        A row's ``_epoch`` is its entry's (a repair's: the epoch it brought the
        sink to). Finding them still reads every batch: scoped mode saves the
        diff and the repair's work here, not the pull's.
        """
        rows = self._fold(None)
        wanted = set(zip(*(keys.column(k).to_pylist() for k in self.keys), strict=True))
        picked = [row for key, row in rows.items()
                  if key in wanted or self._epochs[key] > newer_than]  # fmt: skip
        return _to_arrow(picked, self.schema)

    def count_rows(self) -> int:
        return len(self._fold(None))


class S3RecoveryTarget:
    """The ``RecoveryTarget`` of one file sink on S3 (see ``S3FileSink``)."""

    bucket_checksums = False
    # Each row's epoch is its entry's: scoped mode can run (see pull_keys).
    epoch_column = True

    def __init__(self, sink: S3FileSink, pipeline: str, generation: int | None,
                 key: Sequence[str] | None) -> None:  # fmt: skip
        self.sink, self.pipeline, self.generation = sink, pipeline, generation
        self._key = None if key is None else list(key)
        self._snapshot_end: int | None = None

    @property
    def display(self) -> str:
        return self.sink.location.uri()

    def columns(self) -> dict[str, SinkColumn]:
        return _AnyColumn()

    def key_columns(self) -> list[str]:
        if not self._key:
            raise ConfigurationError(
                f"file sink on S3 {self.display}: its rows have no declared key; give the "
                "table's keys (keys = [...] in the config file, keys= to recover)"
            )
        return list(self._key)

    @contextmanager
    def snapshot(self, schema: pa.Schema, keys: list[str]) -> Iterator[_Snapshot]:
        state = self.sink.log.refresh()
        snap = _Snapshot(self, state, schema, keys)
        self._snapshot_end = snap.end
        yield snap

    def apply(self, repair: Repair) -> int | None:
        """The repair as one batch and one log entry, if the log did not grow since the pull.

        Returns None (nothing made visible) if any entry was appended since the
        snapshot: the caller pulls again.

        Raises:
            FencedError: a newer writer generation holds the pipeline's fence.
            InvalidInputError: the target epoch is older than the sink's newest,
                or a row cannot be written as JSON.
        """
        sink = self.sink
        rows: list[Any] = [{**r, OP: DELETE} for r in repair.deletes.to_pylist()]
        rows += repair.upserts.to_pylist()
        lines = []
        for row in rows:
            try:
                lines.append(json.dumps(row, sort_keys=True, allow_nan=False, default=str).encode())
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(
                    f"{self.display}: a repair row cannot be written as JSON ({exc}): {row!r}; "
                    "nothing was written"
                ) from exc
        end = self._snapshot_end
        repair_id = str(uuid.uuid4())

        def check(state: LogState) -> SinkOutcome | None:
            # Checked on the state the entry follows, by the conditional put:
            # nothing can land between this check and the entry.
            fence = state.fences.generation(self.pipeline).generation
            if self.generation is not None and fence > self.generation:
                raise FencedError(
                    f"file sink {sink.name!r} on S3: generation {self.generation} is fenced "
                    f"off by {fence}; nothing was written",
                    generation=self.generation,
                    fence=fence,
                )
            if state.end != end or state.newest(self.pipeline, sink.name) != repair.seen_newest:
                return Retryable(f"{self.display}: the log grew since the pull")
            return None

        state = sink.log.refresh()
        newest = state.newest(self.pipeline, sink.name)
        if newest is not None and repair.target_epoch < newest:
            raise InvalidInputError(
                f"file sink {sink.name!r} on S3: cannot repair to epoch {repair.target_epoch}, "
                f"older than the sink's newest epoch ({newest}); nothing was written"
            )
        if state.end != end:
            return None  # the log grew since the pull: pull again
        # Whose epochs the repair stands for: the writer's that runs it, or, for
        # an operator's repair, the newest commit's (none: it stands for none).
        owner = (
            sink._binding.log_id
            if self.generation is not None
            else _newest_log(state, self.pipeline, sink.name)
        )
        advances = (self.generation is not None or owner is not None) and (
            newest is None or newest < repair.target_epoch
        )
        if not rows and not advances:
            return 0
        batch = f"{_REPAIRS}{repair_id}.batch"
        header = {"repair": repair_id, "epoch": repair.target_epoch, "rows": len(lines),
                  "log_id": owner, "txn": f"repair {repair_id}"}  # fmt: skip
        sink.bucket.put(batch, b"\n".join([json.dumps(header).encode(), *lines]) + b"\n")
        entry = {
            "kind": "repair",
            "pipeline": self.pipeline,
            "sink": sink.name,
            "epoch": repair.target_epoch,
            "first_epoch": (repair.target_epoch if newest is None else newest + 1)
            if advances else None,
            "log_id": owner,
            "batch": batch,
            "repair_id": repair_id,
            "generation": self.generation,  # None: an operator's repair
            "mode": repair.mode,
            **{k: int(v) for k, v in repair.counts.items()},
        }  # fmt: skip
        # THE repair's commit point: visible, all of it, once this entry's PUT returns.
        try:
            stop = sink.log.append(entry, check)
        except FencedError:
            sink.bucket.delete(batch)
            raise
        if stop is not None:
            # Not appended: the batch no entry names is removed (it would be
            # ignored by every reader anyway).
            sink.bucket.delete(batch)
            return None
        return len(rows)

    def close(self) -> None:
        self.sink.close()


def _newest_log(state: LogState, pipeline: str, sink: str) -> str | None:
    """The log id of the newest commit entry of ``pipeline`` and ``sink``.

    An operator's repair stands for that log's epochs.
    """
    mine = [c for (p, s, _), c in state.committed.items() if (p, s) == (pipeline, sink)]
    newest = max(mine, key=lambda c: c.seq, default=None)
    return None if newest is None else newest.log_id
