"""The rebuild benchmark's data and what it measures beside the clock: a reader, row counters.

- The two logics' states of ``bench_rows (k bigint PRIMARY KEY, v bigint, w text, _epoch bigint)``
  as Arrow: old ``v = 2k``, ``w = 'r' || k``; new the same but every ``step``-th key's ``v``.
- :class:`Reader`: a process of its own (a thread would stall with this process's
  own Python work and count it as the table's) reading one random key every few ms
  on its own connection with a short ``lock_timeout``; the longest gap between two
  successful reads is the longest time the table was locked or unreadable, and a
  read that finds no row saw the table without its rows.
- :func:`settled_writes`: the tables' ``n_tup_ins + n_tup_upd + n_tup_del`` once
  every writer's counters reached the statistics.
- :func:`copy_rows`: an Arrow table into a table by CSV COPY.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import random
import time
from collections import Counter
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
import pyarrow.csv as pacsv  # type: ignore[import-untyped, unused-ignore]
from psycopg import sql

__all__ = ["TABLE", "Reader", "copy_rows", "logic_state", "settled_writes", "with_epoch"]

TABLE = "bench_rows"
READ_EVERY_S = 0.005
# Short enough that a reader queued behind a lock gives up and tries again (each
# try is a read that failed, and the gap grows), long enough for an idle read.
LOCK_TIMEOUT_MS = 50
STATEMENT_TIMEOUT_MS = 200


def logic_state(rows: int, step: int | None) -> pa.Table:
    """The sink table's state under the old logic (``step`` None) or the new one.

    The new logic differs from the old in ``v`` for every ``step``-th key (k = 0,
    step, 2*step, ...): ``ceil(rows / step)`` rows, spread evenly over the keys.
    """
    k = np.arange(rows, dtype=np.int64)
    v = k * 2
    if step is not None:
        v = v + (k % step == 0)
    keys = pa.array(k)
    w = pc.binary_join_element_wise("r", pc.cast(keys, pa.string()), "")
    return pa.table({"k": keys, "v": pa.array(v), "w": w})


def with_epoch(state: pa.Table, epochs: pa.Array | int) -> pa.Table:
    """``state`` with the ``_epoch`` column the sink keeps (one number, or one per row)."""
    if isinstance(epochs, int):
        epochs = pa.array(np.full(state.num_rows, epochs, dtype=np.int64))
    return state.append_column("_epoch", epochs)


def copy_rows(conn: psycopg.Connection[Any], table: str, rows: pa.Table) -> None:
    """COPY ``rows`` into ``table`` (CSV, 200,000 rows a slice), in the caller's transaction."""
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in rows.schema.names)
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        sql.Identifier(table), columns
    )
    options = pacsv.WriteOptions(include_header=False)
    with conn.cursor().copy(statement) as copy:
        for batch in rows.to_batches(max_chunksize=200_000):
            buffer = io.BytesIO()
            pacsv.write_csv(batch, buffer, options)
            copy.write(buffer.getvalue())


_WRITES = """
SELECT relid::bigint, schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_del
FROM pg_stat_user_tables WHERE schemaname NOT LIKE 'pg_temp%'
"""


def _writes(conn: psycopg.Connection[Any]) -> dict[int, tuple[str, int, int, int]]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in conn.execute(_WRITES).fetchall()}


def settled_writes(dsn: str, timeout_s: float = 15.0) -> dict[int, tuple[str, int, int, int]]:
    """Each user table's (name, inserts, updates, deletes) once the counters stop moving.

    A backend sends its counters to the statistics at most once a second while it
    works, and when it exits; the benchmark's own writing sessions call
    ``pg_stat_force_next_flush()`` and the engine's are closed before this is
    called. Every read clears the session's statistics snapshot
    (``pg_stat_clear_snapshot()``) and the figures are taken when two reads half
    a second apart agree.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        seen = _writes(conn)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(0.5)
            again = _writes(conn)
            if again == seen:
                break
            seen = again
        return seen


def written(
    before: dict[int, tuple[str, int, int, int]], after: dict[int, tuple[str, int, int, int]]
) -> dict[str, dict[str, int]]:
    """Per table (by name, as it is called after): the counters' rises, tables that rose only.

    A table created in between counts from zero; one dropped in between is gone
    from the statistics with its counters (nothing here writes to a table it drops).
    """
    rises: dict[str, dict[str, int]] = {}
    for relid, (name, ins, upd, dele) in after.items():
        _, ins0, upd0, del0 = before.get(relid, (name, 0, 0, 0))
        rise = {"inserted": ins - ins0, "updated": upd - upd0, "deleted": dele - del0}
        if any(rise.values()):
            rises[name] = rise
    return rises


def _read_loop(dsn: str, rows: int, ready: Any, stop: Any, out: Any) -> None:
    """The reader process's body (see :class:`Reader`)."""
    rng = random.Random(20_261_128)
    failures: Counter[str] = Counter()
    reads = found = missing = 0
    longest = 0.0
    last_ok: float | None = None
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_MS}ms'")
        conn.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT_MS}ms'")
        query = sql.SQL("SELECT k, v FROM {} WHERE k = %s").format(sql.Identifier(TABLE))
        ready.set()
        while not stop.is_set():
            reads += 1
            try:
                row = conn.execute(query, (rng.randrange(rows),)).fetchone()
            except psycopg.Error as error:  # a lock or statement timeout: the table was busy
                failures[error.sqlstate or type(error).__name__] += 1
            else:
                if row is None:
                    missing += 1
                else:
                    now = time.monotonic()
                    if last_ok is not None:
                        longest = max(longest, now - last_ok)
                    last_ok = now
                    found += 1
            time.sleep(READ_EVERY_S)
    out.put({"reads": reads, "found": found, "missing": missing,
             "failed": dict(failures), "longest_gap_s": round(longest, 4)})  # fmt: skip


class Reader:
    """A reader of random keys in a process of its own, for the span of a ``with`` block."""

    def __init__(self, dsn: str, rows: int) -> None:
        context = mp.get_context("spawn")
        self._ready = context.Event()
        self._stop = context.Event()
        self._out: Any = context.Queue()
        self._process = context.Process(
            target=_read_loop, args=(dsn, rows, self._ready, self._stop, self._out), daemon=True
        )
        self.figures: dict[str, Any] = {}

    def __enter__(self) -> Reader:
        self._process.start()
        if not self._ready.wait(60):
            raise RuntimeError("the reader process did not connect within 60 s")
        time.sleep(0.2)  # a few reads before the method starts: the first gap is measured too
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)  # and a few after it ends, so the last gap closes
        self._stop.set()
        self.figures = self._out.get(timeout=60)
        self._process.join(30)
