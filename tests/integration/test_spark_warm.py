"""A standby's warm-up (``reconcile.spark.warm``): every sink's transform runs on an empty batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconcile.spark.warm import warm_up

pytestmark = [pytest.mark.integration]


def test_warm_up_runs_each_transform_on_an_empty_batch_and_reads_nothing(
    spark: Any, tmp_path: Path
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    # A file in the source: the warm-up must not read it (it is no micro-batch).
    (inbox / "a.json").write_text('{"id": 1, "amount": 5}\n')
    stream = spark.readStream.schema("id long, amount long").json(str(inbox))
    seen: list[tuple[str, int, int, list[str]]] = []

    def totals(batch: Any, batch_id: int) -> Any:
        seen.append(("totals", batch_id, batch.count(), batch.columns))
        return batch.groupBy("id").sum("amount")

    def lines(batch: Any) -> Any:
        seen.append(("lines", -1, batch.count(), batch.columns))
        return batch

    took = warm_up(stream, ["lines", "totals"], {"lines": lines, "totals": totals}, batch_id=7)
    assert took > 0
    assert sorted(seen) == [("lines", -1, 0, ["id", "amount"]),
                            ("totals", 7, 0, ["id", "amount"])]  # fmt: skip
    # Without outputs, every sink gets the batch itself: nothing to call, still no error.
    assert warm_up(stream, ["lines"], None, batch_id=0) > 0
