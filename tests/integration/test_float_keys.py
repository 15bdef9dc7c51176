"""Floating-point key columns are refused wherever a key is declared, before anything is written.

PostgreSQL holds 0.0 and -0.0 (and NaN and NaN) as one key, the expected
state as two: a pipeline keyed by a float would report drift for ever.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
import sqlalchemy as sa

from expected_state.store import ExpectedStateStore
from reconcile.core.contract import Change, ConfigurationError, InvalidInputError
from sinks.postgres.sink import PostgresSink
from sinks.sql.sink import SqlSink

pytestmark = pytest.mark.integration


def test_the_store_refuses_a_float_key_given_in_its_schema(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("price", pa.float64()), ("name", pa.string())])
    with pytest.raises(InvalidInputError) as err:
        ExpectedStateStore(str(tmp_path), "shop", "items", ["id", "price"], schema=schema)
    assert "key column 'price' is of the floating-point type double" in str(err.value)
    assert not any(tmp_path.iterdir())
    # A float that is only a value is fine.
    ExpectedStateStore(str(tmp_path), "shop", "items", ["id"], schema=schema)


def test_the_store_refuses_a_float_key_its_first_epoch_gives(tmp_path: Path) -> None:
    store = ExpectedStateStore(str(tmp_path), "shop", "items", ["price"])
    zero, minus_zero = Change("upsert", {"price": 0.0}), Change("upsert", {"price": -0.0})
    with pytest.raises(InvalidInputError) as err:
        store.apply(0, [zero, minus_zero])
    assert "key column 'price' is of the floating-point type double" in str(err.value)
    assert not (tmp_path / "shop" / "items").exists()  # nothing was written


@pytest.mark.parametrize("sql_type", ["double precision", "real", "float(10)"])
def test_the_postgres_sink_refuses_a_float_key_at_bind(pg_db: str, sql_type: str) -> None:
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE prices (id int, price {sql_type}, PRIMARY KEY (id, price))")
    sink = PostgresSink(pg_db, "prices", name="prices", pipeline="shop")
    with pytest.raises(ConfigurationError) as err:
        sink.setup()
    assert "table public.prices: key column 'price' is of the floating-point type" in str(err.value)
    with psycopg.connect(pg_db) as conn:
        assert conn.execute("SELECT count(*) FROM prices").fetchone() == (0,)


def test_the_sql_sink_refuses_a_float_key_at_bind(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/shop.db"
    with sa.create_engine(url).begin() as conn:
        conn.exec_driver_sql("CREATE TABLE prices (price REAL PRIMARY KEY, name TEXT)")
    sink = SqlSink(url, "prices", name="prices")
    with pytest.raises(ConfigurationError) as err:
        sink.target()
    assert "key column 'price' is of the floating-point type REAL" in str(err.value)
