"""The README's PostgreSQL examples (```python postgres blocks) run as written, on a fresh database.

The blocks read their database from ``SHOP_DSN``, as a reader running them
would set it; they form one program (later blocks use earlier names).
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def test_postgres_examples_run(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python postgres\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2, "the README has no PostgreSQL example"
    monkeypatch.setenv("SHOP_DSN", pg_db)
    namespace: dict[str, object] = {"__name__": "example_postgres"}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    # What the examples wrote is in the database, each row with its epoch.
    with psycopg.connect(pg_db) as conn:
        orders = conn.execute("SELECT count(*), max(amount), max(_epoch) FROM orders").fetchone()
        refunds = conn.execute("SELECT amount FROM refunds ORDER BY refund_id").fetchall()
    assert orders is not None and tuple(orders) == (3, 123450000, 2)
    assert [float(r[0]) for r in refunds] == [0.0, 0.125]
