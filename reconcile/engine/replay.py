"""What a sink is given when an epoch past the commit point must be written to it again."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import Change
from reconcile.engine.expected import OP_COLUMN, ExpectedState

__all__ = ["ReplayRows", "replay_rows"]


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
