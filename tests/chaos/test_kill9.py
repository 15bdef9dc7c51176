"""A real ``kill -9`` of a pipeline process at named points, for every durable sink kind.

The pipeline runs in a subprocess and is SIGKILLed at a named point (no
finalizer, no cleanup code runs); a fresh process then runs the same pipeline
again, and the invariants are checked on the sink's own state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconcile.testing.scenario import SINKS, Scenario
from tests.chaos.kill_pipeline import harness_for
from tests.fix_kafka import KafkaBroker, create_topic
from tests.fix_pg import PgServer
from tests.mariadb_server import MariadbServer

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 4

# (failure-matrix row, point, nth hit, before/after). nth=2: during epoch 1.
KILL_POINTS = [
    ("stage", "sink.alpha.stage", 2, "after"),
    ("record_expected_state", "cycle.record_progress", 2, "after"),
    ("prepare-midway", "sink.alpha.prepare", 2, "after"),
    ("prepare-done", "sink.beta.prepare", 2, "after"),
    ("commit-progress-written", "cycle.commit_progress", 2, "after"),
    ("commit-first-sink", "sink.alpha.commit", 2, "after"),
    ("after_commit_before_ack", "sink.beta.commit", 2, "after"),
    ("finalize", "cycle.finalize", 2, "before"),
    ("engine_crash-before-commit-progress", "cycle.commit_progress", 2, "before"),
]
# Points inside the Delta commit protocol, armed through RECONCILE_KILL_AT:
# after the sink's checks and right before delta-rs writes the log entry.
DELTA_HOOK_POINTS = [
    ("delta-commit-checked", "delta_sink.commit.checked:2"),
    ("delta-before-log-write", "delta.commit_files.before_write:3"),
]
# Points inside the Iceberg commit: after the sink's checks (record, fence, order)
# and right before the catalog is asked to commit (the 3rd catalog commit of the
# run: epoch 0's commit into the first sink, after both sinks' prepares).
ICEBERG_HOOK_POINTS = [
    ("iceberg-commit-checked", "iceberg_sink.commit.checked:2"),
    ("iceberg-before-catalog-commit", "iceberg_sink.commit.before_catalog:3"),
]
# delta_spark: each process starts a Spark JVM of its own (tests/fix_tiers.py puts
# its points in the slow tier).
KINDS = [
    "file", "delta", "iceberg", "postgres", "postgres_prepared", "mariadb", "kafka",
    pytest.param("delta_spark", marks=[pytest.mark.spark, pytest.mark.timeout(900)]),
]  # fmt: skip
# The file sink on S3, killed inside its own steps and right before a commit
# entry's conditional put (the kills between the sinks' steps are the cycle's,
# which the local file sink takes).
S3_KILL_POINTS = [k for k in KILL_POINTS if k[0] in ("prepare-midway", "commit-first-sink")]


def _run(
    kind: str, target: str, root: Path, nonce: int, *fault: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.chaos.kill_pipeline", kind, target, str(root),
         str(EPOCHS), str(nonce), *fault],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=420 if kind == "delta_spark" else 180,  # a JVM start on a busy machine
    )  # fmt: skip


@pytest.fixture
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    kind = request.param
    if kind == "s3":
        yield kind, request.getfixturevalue("s3_bucket")  # the endpoint is in the environment
        return
    if kind == "kafka":
        broker: KafkaBroker = request.getfixturevalue("kafka_broker")
        yield kind, f"{broker.bootstrap}|{create_topic(broker, 'k9')}"
        return
    if kind == "mariadb":
        maria: MariadbServer = request.getfixturevalue("mariadb_server")
        name = maria.create_database("k9")
        try:
            yield kind, maria.url(name)
        finally:
            maria.drop_database(name)
        return
    if not kind.startswith("postgres"):
        yield kind, str(tmp_path / "sinks")
        return
    server: PgServer = request.getfixturevalue("pg_server")
    dbname = server.create_database("k9")
    try:
        yield kind, server.dsn(dbname)
    finally:
        with server.connect(dbname) as conn:
            for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall():
                conn.execute("ROLLBACK PREPARED %s", (gid,))  # type: ignore[arg-type]
        server.drop_database(dbname)


def _kill_then_restart(
    kind: str, target: str, root: Path, fault: tuple[str, ...], env: dict[str, str]
) -> None:
    killed = _run(kind, target, root, 0, *fault, env=env)
    assert killed.returncode == -signal.SIGKILL, (killed.stdout, killed.stderr[-3000:])
    restarted = _run(kind, target, root, 100)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    harness = harness_for(kind, target)
    Scenario(harness, root / "state", sinks=SINKS, nonce_base=200).check(list(range(EPOCHS)))


@pytest.mark.parametrize("target", KINDS, indirect=True)
@pytest.mark.parametrize(
    ("row", "point", "nth", "when"), KILL_POINTS, ids=[k[0] for k in KILL_POINTS]
)
def test_kill9_then_restart_converges(
    target: tuple[str, str], row: str, point: str, nth: int, when: str, tmp_path: Path
) -> None:
    kind, where = target
    _kill_then_restart(kind, where, tmp_path, (point, str(nth), when), {})
    if kind == "file":
        # No epoch committed twice: exactly one committed batch file per epoch.
        for name in SINKS:
            files = sorted(p.name for p in (Path(where) / name / "committed").iterdir())
            assert len(files) == EPOCHS, files


@pytest.mark.parametrize("target", ["s3"], indirect=True)
@pytest.mark.parametrize(
    ("row", "point", "nth", "when"), S3_KILL_POINTS, ids=[k[0] for k in S3_KILL_POINTS]
)
def test_kill9_into_the_s3_file_sink_then_restart_converges(
    target: tuple[str, str], row: str, point: str, nth: int, when: str, tmp_path: Path
) -> None:
    kind, where = target
    _kill_then_restart(kind, where, tmp_path, (point, str(nth), when), {})


@pytest.mark.parametrize("target", ["s3"], indirect=True)
def test_kill9_right_before_the_s3_commit_entry_is_put(
    target: tuple[str, str], tmp_path: Path
) -> None:
    # Each sink has its own log; the appends of the run are alpha's and beta's
    # fence entries, then epoch 0's commit entries, alpha's then beta's: the
    # 4th is killed right before its conditional put, with alpha's epoch 0 in
    # and beta's not. The restart commits beta's from the prepared batch, once.
    kind, where = target
    kill_at = {"RECONCILE_KILL_AT": "s3_file_sink.log.append:4"}
    _kill_then_restart(kind, where, tmp_path, (), kill_at)


@pytest.mark.parametrize("target", ["delta"], indirect=True)
@pytest.mark.parametrize(("row", "spec"), DELTA_HOOK_POINTS, ids=[k[0] for k in DELTA_HOOK_POINTS])
def test_kill9_inside_the_delta_commit(
    target: tuple[str, str], row: str, spec: str, tmp_path: Path
) -> None:
    kind, where = target
    _kill_then_restart(kind, where, tmp_path, (), {"RECONCILE_KILL_AT": spec})


@pytest.mark.parametrize("target", ["iceberg"], indirect=True)
@pytest.mark.parametrize(
    ("row", "spec"), ICEBERG_HOOK_POINTS, ids=[k[0] for k in ICEBERG_HOOK_POINTS]
)
def test_kill9_inside_the_iceberg_commit(
    target: tuple[str, str], row: str, spec: str, tmp_path: Path
) -> None:
    kind, where = target
    _kill_then_restart(kind, where, tmp_path, (), {"RECONCILE_KILL_AT": spec})


@pytest.mark.spark
@pytest.mark.timeout(900)
@pytest.mark.parametrize("target", ["delta_spark"], indirect=True)
def test_kill9_inside_the_delta_spark_commit(target: tuple[str, str], tmp_path: Path) -> None:
    # After the sink's checks (token, order, fence, manifest), right before its
    # Spark command: the restart finds the epoch not in the log and commits it once.
    kind, where = target
    kill_at = {"RECONCILE_KILL_AT": "delta_spark_sink.commit.checked:2"}
    _kill_then_restart(kind, where, tmp_path, (), kill_at)
