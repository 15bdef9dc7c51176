"""Distributed verify and repair on ``local-cluster[2,1,1024]``: run in a subprocess by a test.

``python -m tests.spark_cluster_job DSN STORE TABLE SERVER_LOG``

Two executor JVMs in processes of their own (the test's own session is
``local[2]``, and a process has one SparkContext). It prints one JSON object:
the Spark job's reports (clean, drifted, repaired), the in-process verify's
reports at the same moments (the reference), the error an executor raised when
the snapshot it was to import was gone, and which processes opened the pulls.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any


def ancestry(pid: int) -> list[str]:
    """The command lines of ``pid`` and its ancestors (Linux /proc), nearest first."""
    lines = []
    while pid > 1:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        lines.append(cmdline)
        pid = int(re.search(r"^PPid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
    return lines


def main(argv: list[str]) -> int:
    dsn, store, table, server_log = argv
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import psycopg

    from reconcile import recover
    from reconcile.core import hooks
    from reconcile.recovery.brake import Brake
    from reconcile.spark.verify import SNAPSHOT_EXPORTED, spark_recover
    from tests.fix_spark import build_local_session

    spark = build_local_session("reconcile-cluster-test", "local-cluster[2,1,1024]")
    spark.sparkContext.setLogLevel("ERROR")
    out: dict[str, Any] = {"driver_pid": os.getpid()}

    def both(name: str, **options: Any) -> None:
        out[f"spark_{name}"] = spark_recover(
            spark, dsn, store, "shop", table, partitions=4, **options
        ).as_dict()
        out[f"local_{name}"] = recover(
            dsn, store, "shop", table, mode="full", dry_run=True
        ).as_dict()

    both("clean")
    # Who opened the pulls, read while the executors live: (worker pid, its parent's).
    pulls = set(re.findall(r"application_name=reconcile-pull-(\d+)-(\d+)",
                           Path(server_log).read_text()))  # fmt: skip
    out["pull_processes"] = {pid: ancestry(int(parent)) for pid, parent in sorted(pulls)}
    with psycopg.connect(dsn, autocommit=True) as conn:
        t = psycopg.sql.Identifier(table)
        conn.execute(psycopg.sql.SQL("DELETE FROM {} WHERE region = 'eu'").format(t))
        conn.execute(psycopg.sql.SQL("UPDATE {} SET note = NULL WHERE region = 'us'").format(t))
        conn.execute(
            psycopg.sql.SQL("UPDATE {} SET ratio = ratio + 1 WHERE region = 'ap'").format(t)
        )
        conn.execute(
            psycopg.sql.SQL(
                "INSERT INTO {} (region, id, note) VALUES ('zz', gen_random_uuid(), 'hand')"
            ).format(t)
        )
    both("drifted")
    # 123 of 221 rows drifted by hand: past the mass-change brake, lifted.
    both("repaired", dry_run=False, batch_rows=7, brake=Brake(allow_mass_change=True))

    def end_the_exporting_session() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                "current_database() AND pid <> pg_backend_pid() AND state = 'idle in transaction'"
            )

    with hooks.at(SNAPSHOT_EXPORTED, end_the_exporting_session) as arming:
        try:
            spark_recover(spark, dsn, store, "shop", table, partitions=4)
            out["error"] = None
        except Exception as exc:
            out["error"] = {
                "type": f"{type(exc).__module__}.{type(exc).__name__}",
                "message": str(exc),
            }
    out["fired"] = arming.fired

    print(json.dumps(out, default=str), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
