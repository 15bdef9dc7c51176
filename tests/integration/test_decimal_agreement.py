"""The Postgres sink and the expected-state store accept and refuse the same decimal values.

An epoch that one of them takes and the other refuses would leave the sink
holding what the expected state does not (or the reverse): both apply the
rule of ``reconcile.core.decimals`` before anything is written.
"""

from __future__ import annotations

import decimal
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from expected_state.store import ExpectedStateStore
from reconcile.core.contract import OK, Change, InvalidInputError, SinkTxnId
from sinks.postgres.factory import postgres_sink

pytestmark = pytest.mark.integration

D = decimal.Decimal
VALUES = [
    D("1.005"),  # one digit too many: the server would round it to 1.01
    1.005,  # a float whose shortest form has three decimals
    D("1.5"),
    D("1.500"),  # trailing zeros do not count
    1.25,
    D("9999999999.99"),
    D("10000000000.00"),  # one digit too many before the point
    7,
]


@pytest.mark.parametrize("value", VALUES, ids=[repr(v) for v in VALUES])
def test_sink_and_store_agree(value: object, pg_db: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE money (id int PRIMARY KEY, amount numeric(12, 2))")
    sink = postgres_sink(pg_db, "money", name="money")
    txn = SinkTxnId("p", "money", 0)
    assert sink.stage(txn, [{"id": 1, "amount": value}]) == OK
    outcome = sink.prepare(txn)
    if outcome == OK:
        assert sink.commit(txn) == OK
    sink.close()
    schema = pa.schema([("id", pa.int32()), ("amount", pa.decimal128(12, 2))])
    store = ExpectedStateStore(str(tmp_path), "p", "money", ["id"], schema=schema)
    try:
        store.apply(0, [Change("upsert", {"id": 1, "amount": value})])
        stored = True
    except InvalidInputError as exc:
        assert "amount" in str(exc) and "exactly" in str(exc)
        stored = False
    assert (outcome == OK) == stored, (value, outcome, stored)
    with psycopg.connect(pg_db) as conn:
        row = conn.execute("SELECT amount FROM money").fetchone()
    if stored:
        # What the sink holds is exactly what the store holds, digit for digit.
        held = store.snapshot().column("amount")[0].as_py()
        assert row is not None and row[0] == held == D(str(value))
    else:
        assert row is None  # nothing was written
