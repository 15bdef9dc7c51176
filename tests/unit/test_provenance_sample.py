"""Which differing rows provenance traces (no database): the bound, the order, the option."""

from __future__ import annotations

import pyarrow as pa
import pytest

from reconcile.cli.recover import provenance_lines
from reconcile.core.contract import ConfigurationError
from reconcile.recovery.diff import Diff
from reconcile.recovery.options import RecoverOptions
from reconcile.recovery.provenance import sample
from reconcile.recovery.report import ReconcileReport

KEYS = ["region", "id"]


def keys(*pairs: tuple[str, int]) -> pa.Table:
    return pa.table({"region": [r for r, _ in pairs], "id": [i for _, i in pairs]})


def test_changed_then_extra_then_missing_each_in_key_order_up_to_the_bound() -> None:
    diff = Diff(
        missing=keys(("eu", 1)),
        extra=keys(("us", 2), ("eu", 9)),
        changed=keys(("us", 1), ("eu", 3)),
    )
    picked = [(kind, t.to_pylist()) for kind, t in sample(diff, KEYS, 4)]
    assert picked == [
        ("changed", [{"region": "eu", "id": 3}, {"region": "us", "id": 1}]),
        ("extra", [{"region": "eu", "id": 9}, {"region": "us", "id": 2}]),
    ]
    assert sum(t.num_rows for _, t in sample(diff, KEYS, 5)) == 5
    assert sum(t.num_rows for _, t in sample(diff, KEYS, 50)) == 5
    assert sample(diff, KEYS, 0) == []


def test_an_empty_kind_is_skipped() -> None:
    none = keys()
    diff = Diff(missing=keys(("eu", 1)), extra=none, changed=none)
    assert [(kind, t.num_rows) for kind, t in sample(diff, KEYS, 3)] == [("missing", 1)]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_provenance_rows_must_be_a_count(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=f"provenance_rows .*{bad!r}"):
        RecoverOptions(provenance_rows=bad)  # type: ignore[arg-type]
    assert RecoverOptions(provenance_rows=0).provenance_rows == 0


def report(**fields: object) -> ReconcileReport:
    base: dict[str, object] = dict(
        table="public.t", mode="full", reason="", target_epoch=1, rows_pulled=3,
        buckets_compared=0, buckets_differing=0, missing=1, extra=0, changed=1, applied=0,
        seconds=0.1, dry_run=True,
    )  # fmt: skip
    base.update(fields)
    return ReconcileReport(**base)  # type: ignore[arg-type]


def test_the_table_view_section() -> None:
    rows = (
        {"kind": "changed", "key": {"id": 2}, "columns": ["a", "b"], "xid": "77",
         "committed_at": None, "writer": "foreign", "note": "x"},
        {"kind": "missing", "key": {"id": 5}, "columns": [], "xid": None,
         "committed_at": None, "writer": "none", "note": "the sink lacks this row"},
    )  # fmt: skip
    lines = provenance_lines(report(provenance=rows, foreign_writes=1, provenance_note="off"))
    assert lines == [
        "  provenance of 2 of the 2 differing rows (1 written by a foreign transaction):",
        "    changed (id=2) columns a, b: xid 77, commit time unknown: foreign",
        "    missing (id=5): the sink lacks this row",
        "    (off)",
    ]
    assert provenance_lines(report(provenance_note="not available")) == [
        "  provenance: not available"
    ]
    assert provenance_lines(report(missing=0, changed=0, provenance_note="n/a")) == []
