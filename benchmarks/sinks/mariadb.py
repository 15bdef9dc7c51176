"""The MariaDB part of the sink benchmarks: MariaDB through the SQL sink (PyMySQL).

A throwaway MariaDB server (Debian's ``mariadbd``), durable as in production
(``innodb_flush_log_at_trx_commit = 1``, doublewrite on); the table
``bench_rows (k varchar(32) COLLATE utf8mb4_nopad_bin PRIMARY KEY, v bigint,
_epoch bigint)`` written by ``SqlSink``. Its verify pulls keyset pages through
SQLAlchemy. The figures: ``benchmarks/sink_harness.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.sink_harness import TABLE, Part, measure

__all__ = ["WRITE_PATH", "run"]

WRITE_PATH = (
    "an epoch is one transaction: its rows as multi-row INSERT ... ON DUPLICATE KEY UPDATE "
    "statements over PyMySQL (a pure-Python driver), with its marker; verify pulls keyset "
    "pages of 50,000 rows through SQLAlchemy and converts them to Arrow in Python"
)


def run(small_epochs: int, big_rows: int) -> dict[str, Any]:
    """The part's figures, on a server started and removed here."""
    from sinks.sql.sink import SqlSink
    from tests.mariadb_server import MariadbServer

    durable = {"innodb-flush-log-at-trx-commit": 1, "innodb-doublewrite": 1,
               "innodb-buffer-pool-size": "512M", "innodb-log-file-size": "256M"}  # fmt: skip
    with MariadbServer(**durable) as server, tempfile.TemporaryDirectory() as tmp:
        db = server.create_database("bench")
        with server.connect(db) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {TABLE} (k VARCHAR(32) COLLATE utf8mb4_nopad_bin "
                        "PRIMARY KEY, v BIGINT, _epoch BIGINT)")  # fmt: skip
            cur.execute("SELECT version()")
            version = str(cur.fetchone()[0])  # type: ignore[index]
        url = server.url(db)
        part = Part(
            system=f"MariaDB {version.split('-')[0]}",
            sink="SqlSink (PyMySQL)",
            open=lambda: SqlSink(url, TABLE, name=TABLE),
            verify_uri=url,
            servers=(server.server_pid(),),
        )
        return measure(part, Path(tmp), small_epochs, big_rows)
