"""The rebuild plan: exact insert/update/delete counts from two expected states, no database."""

from __future__ import annotations

import pyarrow as pa
import pytest

from reconcile.core.contract import InvalidInputError
from reconcile.rebuild import plan_table


def rows(data: dict[tuple[int, str], str | None]) -> pa.Table:
    return pa.table(
        {
            "a": pa.array([k[0] for k in data], pa.int64()),
            "b": pa.array([k[1] for k in data], pa.string()),
            "v": pa.array(list(data.values()), pa.string()),
        }
    )


def test_counts_by_composite_key() -> None:
    old = rows({(1, "x"): "p", (2, "x"): "q", (2, "y"): "r", (3, "z"): None})
    new = rows({(1, "x"): "p", (2, "x"): "Q", (2, "y"): None, (4, "z"): "s", (4, "w"): "t"})
    plan = plan_table("public.t", old, new, ["a", "b"])
    assert (plan.inserts, plan.updates, plan.deletes) == (2, 2, 1)
    assert plan.changed == 5
    assert sorted((r["a"], r["b"]) for r in plan.sample["update"]) == [(2, "x"), (2, "y")]
    assert plan.sample["delete"] == [{"a": 3, "b": "z"}]


def test_same_rows_in_another_column_order_plan_nothing() -> None:
    old = rows({(1, "x"): "p", (2, "y"): None})
    new = old.select(["v", "b", "a"])
    plan = plan_table("public.t", old, new, ["a", "b"])
    assert plan.changed == 0


@pytest.mark.parametrize("empty", ["old", "new"])
def test_an_empty_side(empty: str) -> None:
    full = rows({(1, "x"): "p", (2, "y"): "q"})
    none = full.slice(0, 0)
    old, new = (none, full) if empty == "old" else (full, none)
    plan = plan_table("public.t", old, new, ["a", "b"], sample=1)
    assert (plan.inserts, plan.deletes) == ((2, 0) if empty == "old" else (0, 2))
    assert plan.updates == 0
    assert len(plan.sample["insert" if empty == "old" else "delete"]) == 1


def test_a_missing_key_column_names_the_table() -> None:
    old = rows({(1, "x"): "p"})
    with pytest.raises(InvalidInputError, match=r"public\.t.*\['b'\]"):
        plan_table("public.t", old, old.drop_columns(["b"]), ["a", "b"])
