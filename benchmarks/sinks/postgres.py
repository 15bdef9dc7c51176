"""The PostgreSQL part of the sink benchmarks: the reference every other sink stands beside.

A throwaway PostgreSQL server of this machine's binaries, durable as in
production (fsync and full-page writes on); the table
``bench_rows (k text PRIMARY KEY, v bigint, _epoch bigint)`` written by
``postgres_sink`` in transactional mode. Its verify pulls through the binary
COPY fast path. The figures: ``benchmarks/sink_harness.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.sink_harness import TABLE, Part, measure

__all__ = ["WRITE_PATH", "run"]

WRITE_PATH = (
    "an epoch is one transaction: its rows COPY'd (as CSV, in bounded slices) into a "
    "temporary table and merged into the target with INSERT ... ON CONFLICT, with its "
    "marker (a big epoch of a free integer key range is COPY'd straight into the table; "
    "this table's key is text); verify pulls with a binary COPY decoded into Arrow in C++"
)


def run(small_epochs: int, big_rows: int) -> dict[str, Any]:
    """The part's figures, on a server started and removed here."""
    from reconcile.demo.embedded_pg import EmbeddedPostgres
    from sinks.postgres.factory import postgres_sink

    with EmbeddedPostgres(fsync="on", full_page_writes="on") as server, \
            tempfile.TemporaryDirectory() as tmp:  # fmt: skip
        name = server.create_database("bench")
        with server.connect(name) as conn:
            conn.execute(f"CREATE TABLE {TABLE} (k text PRIMARY KEY, v bigint, _epoch bigint)")
            version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        dsn = server.dsn(name)
        part = Part(
            system=f"PostgreSQL {version.split()[0]}",
            sink="postgres_sink (transactional)",
            open=lambda: postgres_sink(dsn, TABLE, name=TABLE),
            verify_uri=dsn,
            servers=(server.postmaster_pid(),),
        )
        return measure(part, Path(tmp), small_epochs, big_rows)
