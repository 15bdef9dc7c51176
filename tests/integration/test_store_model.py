"""The merge-on-read store against a dict model: random upserts, deletes, reverts, compactions.

Hypothesis draws a sequence of operations; the store runs them on a real Delta
table and a plain dict model runs them too. Then every recorded epoch is read
back (time travel), with the store's own ``snapshot`` and with a plain Delta
reader plus the ``resolve`` rule, and compared with the model; so are each
epoch's recorded changes and the keys changed since every epoch.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from expected_state.merge import resolve
from expected_state.store import ExpectedStateStore
from reconcile.core.contract import InvalidInputError
from reconcile.core.hashing import row_hash_arrow

pytestmark = pytest.mark.integration

Key = tuple[Any, ...]

# One change: (key number, value or None for a delete).
changes_st = st.lists(
    st.tuples(st.integers(0, 7), st.one_of(st.none(), st.integers(-5, 1000))), max_size=6
)
op_st = st.one_of(
    st.tuples(st.just("apply"), changes_st, st.booleans()),  # (changes, skip an epoch?)
    st.tuples(st.just("revert"), st.just(None), st.just(False)),
    st.tuples(st.just("compact"), st.integers(0, 2), st.just(False)),  # fold all but n newest
    st.tuples(st.just("merge"), st.integers(0, 2), st.just(False)),  # merge all but n newest
)


@dataclass
class Model:
    """What the store must hold: the state after each recorded epoch, and its net changes."""

    states: dict[int, dict[Key, int | None]] = field(default_factory=dict)
    changes: dict[int, dict[Key, int | str | None]] = field(default_factory=dict)
    # The live change files as (first, last) epochs, and the epoch the base holds.
    files: list[tuple[int, int]] = field(default_factory=list)
    base_through: int = -1

    def revertible(self, epoch: int) -> bool:
        """An epoch with a file of its own, or no changes and not folded."""
        if any(first <= epoch <= last and first != last for first, last in self.files):
            return False
        return (epoch, epoch) in self.files or epoch > self.base_through

    def take(self, through: int) -> list[tuple[int, int]]:
        """Remove and return the live change files of epochs up to ``through``."""
        taken = [f for f in self.files if f[1] <= through]
        self.files = [f for f in self.files if f[1] > through]
        return taken

    @property
    def last(self) -> int | None:
        return max(self.states) if self.states else None

    def state_at(self, epoch: int) -> dict[Key, int | None]:
        recorded = [e for e in self.states if e <= epoch]
        return dict(self.states[max(recorded)]) if recorded else {}


def key_of(number: int, composite: bool) -> dict[str, Any]:
    return {"k": f"k{number}", "n": number % 3} if composite else {"k": f"k{number}"}


def as_model(table: pa.Table, keys: list[str]) -> dict[Key, int | None]:
    return {tuple(r[k] for k in keys): r["v"] for r in table.to_pylist()}


def run(ops: list[tuple[str, Any, bool]], composite: bool) -> None:
    keys = ["k", "n"] if composite else ["k"]
    fields = [pa.field("k", pa.string(), nullable=False)]
    if composite:
        fields.append(pa.field("n", pa.int64(), nullable=False))
    schema = pa.schema([*fields, pa.field("v", pa.int64())])
    with tempfile.TemporaryDirectory() as root:
        store = ExpectedStateStore(root, "pipe", "t", keys, schema=schema)
        model = Model()
        epoch = 0
        for kind, arg, skip in ops:
            if kind == "apply":
                epoch = (model.last + 1 if model.last is not None else 0) + (1 if skip else 0)
                rows = []
                net: dict[Key, int | str | None] = {}
                for number, value in arg:
                    row = key_of(number, composite)
                    key = tuple(row[k] for k in keys)
                    if value is None:
                        rows.append({**row, "v": None, "_op": "delete"})
                        net[key] = "delete"
                    else:
                        rows.append({**row, "v": value, "_op": "upsert"})
                        net[key] = value
                table = pa.Table.from_pylist(
                    rows, schema=schema.append(pa.field("_op", pa.string()))
                )
                result = store.apply(epoch, table, allow_gap=True)
                assert result.applied
                state = model.state_at(epoch)
                for key, value in net.items():
                    if value == "delete":
                        state.pop(key, None)
                    else:
                        state[key] = value  # type: ignore[assignment]
                model.states[epoch] = state
                model.changes[epoch] = net
                if net:
                    model.files.append((epoch, epoch))
            elif kind == "revert" and model.last is not None:
                last = model.last
                if not model.revertible(last):
                    with pytest.raises(InvalidInputError, match="can no longer be reverted"):
                        store.revert(last)
                    continue
                assert store.revert(last)
                assert not store.revert(last)  # idempotent
                del model.states[last], model.changes[last]
                model.files = [f for f in model.files if f != (last, last)]
            elif kind == "compact" and model.last is not None:
                through = model.last - arg
                store.compact(through_epoch=through)
                folded = model.take(through)
                if folded:
                    model.base_through = max(x for _, x in folded)
            elif kind == "merge" and model.last is not None:
                through = model.last - arg
                store.compact_changes(through_epoch=through)
                merged = model.take(through)
                if len(merged) > 1:
                    model.files.append((min(f for f, _ in merged), max(x for _, x in merged)))
                else:
                    model.files.extend(merged)
            check(store, model, keys)


def check(store: ExpectedStateStore, model: Model, keys: list[str]) -> None:
    last = model.last
    assert store.last_epoch() == last
    if last is None:
        assert store.snapshot().num_rows == 0
        return
    first = min(model.states)
    for epoch in range(first, last + 1):  # recorded epochs and those skipped over
        snap = store.snapshot(epoch)
        assert as_model(snap, keys) == model.state_at(epoch), epoch
        assert snap.num_rows == len(model.state_at(epoch))  # one row per key
        names = store.user_schema.names  # type: ignore[union-attr]
        assert snap.column("_row_hash").to_pylist() == row_hash_arrow(snap, names).to_pylist()
        expected_changes = model.changes.get(epoch, {})
        got = {
            tuple(r[k] for k in keys): ("delete" if r["_op"] == "delete" else r["v"])
            for r in store.changes_of(epoch).to_pylist()
        }
        assert got == expected_changes, epoch
        changed = {
            tuple(r[k] for k in keys): r["_deleted"] for r in store.changed_keys(epoch).to_pylist()
        }
        later: dict[Key, bool] = {}
        for e in sorted(x for x in model.changes if x > epoch):
            for key, value in model.changes[e].items():
                later[key] = value == "delete"
        assert changed == later, epoch
    # A plain Delta reader sees the same state through the documented rule.
    plain = resolve(pa.table(DeltaTable(store.uri).to_pyarrow_table()), keys)
    assert as_model(plain, keys) == model.states[last]
    assert as_model(store.snapshot(), keys) == model.states[last]


@pytest.mark.parametrize("composite", [False, True], ids=["one-key", "composite-key"])
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(op_st, min_size=1, max_size=10))
# Fixed cases, so that a fresh clone (no Hypothesis database) always reads an
# epoch older than a fold and than a merge, and the changes after each.
@example(
    ops=[("apply", [(2, 5), (1, 1)], False), ("apply", [(1, 2)], False), ("compact", 0, False)]
)
@example(ops=[("apply", [(2, 5), (1, 1)], False), ("apply", [(1, 2)], False), ("merge", 0, False)])
def test_store_matches_the_model_at_every_epoch(
    composite: bool, ops: list[tuple[str, Any, bool]]
) -> None:
    run(ops, composite)
