"""The MariaDB part of the sink benchmarks: MariaDB through the SQL sink, PostgreSQL beside it.

Each database is a throwaway server of its own on this machine, durable as in
production (MariaDB: ``innodb_flush_log_at_trx_commit = 1``, doublewrite on;
PostgreSQL: fsync and full-page writes on). On each, one table
``(k varchar(32) PRIMARY KEY, v bigint, _epoch bigint)``, written by the sink
of that database (MariaDB: ``SqlSink``, PyMySQL; PostgreSQL: ``postgres_sink``
in transactional mode), and measured three ways:

- small epochs: ``small_epochs`` epochs of 100 new rows, stage + prepare +
  commit timed per epoch (p50, p95);
- a big epoch: ``big_rows`` new rows in one epoch, rows/s;
- a full verify of that table against its expected state (``recover(...,
  mode="full", dry_run=True)``), rows/s. PostgreSQL's pull is its binary COPY
  fast path; MariaDB's is the generic path's keyset pages.

``run(...)`` returns the part's report; ``markdown(...)`` and ``plot(...)``
render it (``benchmarks/sinks.py`` writes them).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.expected_state import summary
from expected_state.store import ExpectedStateStore
from reconcile import recover
from reconcile.core.contract import OK, SinkTxnId
from reconcile.core.sink import TwoPhaseSink

__all__ = ["markdown", "plot", "run"]

TABLE = "bench_rows"
PIPELINE = "bench"


def _rows(first: int, count: int) -> pa.Table:
    numbers = np.arange(first, first + count)
    keys = [f"k{n:012d}" for n in numbers]
    return pa.table({"k": keys, "v": numbers * 7})


def _epoch(sink: TwoPhaseSink, epoch: int, rows: pa.Table) -> float:
    txn = SinkTxnId(PIPELINE, TABLE, epoch, 0)
    start = time.perf_counter()
    if not (sink.stage(txn, rows) == OK and sink.prepare(txn) == OK and sink.commit(txn) == OK):
        raise RuntimeError(f"epoch {epoch} did not commit into {TABLE}")
    return time.perf_counter() - start


def _measure(sink: TwoPhaseSink, url: str, root: Path, small_epochs: int, big_rows: int
             ) -> dict[str, Any]:  # fmt: skip
    """The three figures on one database, through ``sink`` (closed here)."""
    store = ExpectedStateStore(str(root), PIPELINE, TABLE, ["k"], schema=_rows(0, 1).schema)
    big = _rows(0, big_rows)
    store.apply(0, big.append_column("_op", pa.array(["upsert"] * big.num_rows)))
    big_s = _epoch(sink, 0, big)
    small = []
    for epoch in range(1, small_epochs + 1):
        rows = _rows(big_rows + epoch * 100, 100)
        store.apply(epoch, rows.append_column("_op", pa.array(["upsert"] * 100)))
        small.append(_epoch(sink, epoch, rows) * 1000)
    sink.close()
    total = big_rows + 100 * small_epochs
    start = time.perf_counter()
    report = recover(url, str(root), PIPELINE, TABLE, mode="full", dry_run=True)
    verify_s = time.perf_counter() - start
    if report.drift or report.rows_pulled != total:
        raise RuntimeError(f"verify found drift or pulled {report.rows_pulled} of {total} rows")
    return {
        "small_epoch_commit": {"rows": 100, **summary(small)},
        "big_epoch": {"rows": big_rows, "seconds": round(big_s, 2),
                      "rows_per_s": round(big_rows / big_s)},
        "full_verify": {"rows": total, "seconds": round(verify_s, 2),
                        "rows_per_s": round(total / verify_s)},
    }  # fmt: skip


def _mariadb(small_epochs: int, big_rows: int) -> dict[str, Any]:
    from sinks.sql.sink import SqlSink
    from tests.mariadb_server import MariadbServer

    durable = {"innodb-flush-log-at-trx-commit": 1, "innodb-doublewrite": 1,
               "innodb-buffer-pool-size": "512M", "innodb-log-file-size": "256M"}  # fmt: skip
    with MariadbServer(**durable) as server, tempfile.TemporaryDirectory() as tmp:
        db = server.create_database("bench")
        with server.connect(db) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {TABLE} (k VARCHAR(32) COLLATE utf8mb4_bin PRIMARY KEY, "
                        "v BIGINT, _epoch BIGINT)")  # fmt: skip
            cur.execute("SELECT version()")
            version = str(cur.fetchone()[0])  # type: ignore[index]
        url = server.url(db)
        figures = _measure(SqlSink(url, TABLE, name=TABLE), url, Path(tmp), small_epochs, big_rows)
        return {"server": f"MariaDB {version}", "sink": "SqlSink (PyMySQL)", **figures}


def _postgres(small_epochs: int, big_rows: int) -> dict[str, Any]:
    from reconcile.demo.embedded_pg import EmbeddedPostgres
    from sinks.postgres.factory import postgres_sink

    with EmbeddedPostgres(fsync="on", full_page_writes="on") as server, \
            tempfile.TemporaryDirectory() as tmp:  # fmt: skip
        name = server.create_database("bench")
        with server.connect(name) as conn:
            conn.execute(f"CREATE TABLE {TABLE} (k text PRIMARY KEY, v bigint, _epoch bigint)")
            version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        dsn = server.dsn(name)
        sink = postgres_sink(dsn, TABLE, name=TABLE)
        figures = _measure(sink, dsn, Path(tmp), small_epochs, big_rows)
        return {"server": f"PostgreSQL {version}", "sink": "postgres_sink (transactional)",
                **figures}  # fmt: skip


def run(small_epochs: int = 200, big_rows: int = 1_000_000) -> dict[str, Any]:
    """The MariaDB part: the same figures on MariaDB and on PostgreSQL."""
    return {
        "scale": {"small_epochs": small_epochs, "big_rows": big_rows},
        "mariadb": _mariadb(small_epochs, big_rows),
        "postgres": _postgres(small_epochs, big_rows),
    }


def markdown(part: dict[str, Any]) -> str:
    """The part as a Markdown section: one row per database."""
    lines = [
        "## MariaDB beside PostgreSQL",
        "",
        f"{part['scale']['small_epochs']} small epochs of 100 rows, then a verify; one big epoch "
        f"of {part['scale']['big_rows']:,} rows. Each database durable (fsync on), on this "
        "machine, written by its own sink.",
        "",
        "| database | sink | small epoch p50 / p95 (ms) | big epoch rows/s | full verify rows/s |",
        "|---|---|---|---|---|",
    ]
    for key in ("mariadb", "postgres"):
        f = part[key]
        small = f["small_epoch_commit"]
        lines.append(
            f"| {f['server']} | {f['sink']} | {small['p50_ms']} / {small['p95_ms']} | "
            f"{f['big_epoch']['rows_per_s']:,} | {f['full_verify']['rows_per_s']:,} |"
        )
    return "\n".join(lines) + "\n"


def plot(part: dict[str, Any], path: Path) -> None:
    """Bars: the three figures, MariaDB beside PostgreSQL."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["mariadb", "postgres"]
    panels = [
        ("small epoch p95 (ms)", lambda f: f["small_epoch_commit"]["p95_ms"]),
        ("big epoch (rows/s)", lambda f: f["big_epoch"]["rows_per_s"]),
        ("full verify (rows/s)", lambda f: f["full_verify"]["rows_per_s"]),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, (title, value) in zip(axes, panels, strict=True):
        ax.bar(names, [value(part[n]) for n in names], color=["#c0765a", "#336791"])
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
