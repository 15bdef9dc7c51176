"""A pipeline run in a subprocess, SIGKILLed at a named point by the chaos suite.

``python -m tests.chaos.kill_pipeline KIND TARGET ROOT EPOCHS NONCE [POINT NTH WHEN]``

With ``RECONCILE_EXPECTED_STATE=1`` in the environment the pipeline records its
expected state under ``ROOT/expected`` (its epochs table is then the progress log).

KIND is file, s3, delta, delta_spark (a Spark JVM of its own), iceberg, postgres,
postgres_prepared, mariadb or kafka; TARGET is the sink root folder (file, delta,
delta_spark; iceberg: its SQLite catalog and warehouse), a bucket (s3), the database
DSN (postgres), URL (mariadb) or BOOTSTRAP|TOPIC (kafka). The pipeline dies by
SIGKILL at POINT (a fault point of the cycle or a sink); a hook point inside
a sink can be armed instead with RECONCILE_KILL_AT in the environment. NONCE
is the first run number of this process's outputs, so a restarted process
computes rows that differ from the killed one's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from reconcile.engine.faults import Fault, FaultKind, FaultPlan
from reconcile.testing.harness import SinkHarness
from reconcile.testing.scenario import Scenario


def harness_for(kind: str, target: str) -> SinkHarness:
    """The harness of ``kind`` on ``target`` (a folder, a bucket for S3, a DSN or a URL)."""
    if kind == "file":
        from tests.fix_sinks import FileHarness

        return FileHarness(Path(target))
    if kind == "s3":
        from tests.fix_s3 import S3Harness

        return S3Harness(target)  # a bucket on the endpoint the environment names
    if kind == "delta":
        from tests.fix_delta import DeltaHarness

        return DeltaHarness(Path(target))
    if kind == "delta_spark":
        from tests.fix_delta_spark import DeltaSparkHarness

        # Its sinks commit on the active session (main starts it); the
        # harness itself reads the table with delta-rs and needs none.
        return DeltaSparkHarness(Path(target), None)
    if kind == "iceberg":
        from tests.fix_iceberg import IcebergHarness

        return IcebergHarness(Path(target))
    if kind == "mariadb":
        from tests.fix_mariadb import MariadbHarness

        return MariadbHarness(target)
    if kind == "kafka":
        from tests.fix_kafka import KafkaHarness

        return KafkaHarness(target)  # BOOTSTRAP|TOPIC
    from tests.fix_pg import PostgresHarness

    return PostgresHarness(target, "prepared" if kind == "postgres_prepared" else "transactional")


def main(argv: list[str]) -> int:
    kind, target, root, epochs, nonce = argv[0], argv[1], Path(argv[2]), int(argv[3]), int(argv[4])
    plan = FaultPlan()
    if len(argv) > 5:
        point, nth, when = argv[5], int(argv[6]), argv[7]
        plan = FaultPlan([Fault(point, FaultKind.KILL, nth=nth, when=when)])  # type: ignore[arg-type]
    if kind == "delta_spark":
        from tests.fix_spark import build_local_session

        build_local_session("reconcile-kill9", "local[1]").sparkContext.setLogLevel("ERROR")
    # The same call every time: the driver skips what is in and resumes.
    expected = root / "expected" if os.environ.get("RECONCILE_EXPECTED_STATE") else None
    Scenario(
        harness_for(kind, target), root / "state", plan, nonce_base=nonce, expected_root=expected
    ).run(list(range(epochs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
