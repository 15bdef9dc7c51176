"""A pipeline's ``[pipelines.NAME.run]`` table: how ``reconcile run`` streams it.

Read by :func:`reconcile.cli.config.load_config` into :class:`RunSettings`
(``PipelineConfig.run``; None when the table is absent)::

    [pipelines.orders.run]
    app = "shop.stream:orders"          # f(spark, pipeline) -> a streaming DataFrame
    logic_version = "2026-11-orders"    # the app's logic; default: the app itself
    rebuild_input = "archive/orders"    # what a rebuild replays if the source keeps no file list
    checkpoint = "state/checkpoints/orders"
    staging = "state/staging/orders"    # default: <checkpoint>.staging, beside it
    trigger = "1 second"                # or "available-now"; default: back to back
    via = "auto"                        # or "executors", "driver"
    collect_max_bytes = 16777216        # via="auto": the largest batch collected
    lease_term_s = 2.0
    lease_dsn = "postgresql://..."      # default: the first sink's Postgres connection
    master = "local[2]"

    [pipelines.orders.run.spark]        # Spark conf, strings
    "spark.sql.shuffle.partitions" = "4"

A pipeline of one PostgreSQL sink fed by Kafka may run under Spark's Real-Time
Mode instead of micro-batches (``reconcile.spark.realtime``, docs/realtime.md)::

    [pipelines.events.run]
    app = "shop.stream:events"          # a frame of the Kafka source's topic/partition/offset
    checkpoint = "state/checkpoints/events"
    realtime = "5 seconds"              # the long batch's duration
    rows_per_txn = 100                  # a transaction holds at most this many rows
    ms_per_txn = 100                    # or is committed once its oldest row is this old
    writer = "jvm"                      # or "python"

``trigger``, ``via`` and ``collect_max_bytes`` are the micro-batch writer's, and
refused beside ``realtime``.

Paths are taken from the config file's folder, as everywhere in the file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconcile.cli.config_read import Connection, TableReader, choice, fill_connection, local_path
from reconcile.core.lease import DEFAULT_TERM_S
from sinks import registry
from sinks.base import LEASE, REALTIME

__all__ = ["RUN_KEYS", "RunSettings", "provides", "read_run"]

RUN_KEYS = (
    "app", "logic_version", "checkpoint", "staging", "trigger", "via", "collect_max_bytes",
    "lease_term_s", "lease_dsn", "master", "spark", "rebuild_input", "realtime", "rows_per_txn",
    "ms_per_txn", "writer",
)  # fmt: skip
# The micro-batch writer's keys: Real-Time Mode has no trigger of its own nor staging path.
MICRO_BATCH_KEYS = ("trigger", "via", "collect_max_bytes")
REALTIME_WRITERS = ("jvm", "python")
VIA = ("auto", "executors", "driver")
AVAILABLE_NOW = "available-now"
DEFAULT_MASTER = "local[2]"

_APP = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", re.ASCII)
# What Spark's processingTime accepts and people write: "1 second", "500 milliseconds".
_DURATION = re.compile(r"\d+(\.\d+)?\s+(millisecond|second|minute|hour|day)s?", re.IGNORECASE)


@dataclass(frozen=True)
class RunSettings:
    """How ``reconcile run`` streams a pipeline (its ``run`` table).

    Attributes:
        app: ``package.module:function``, the function that makes the stream.
        checkpoint: Spark's checkpoint folder (shared by main and standby).
        staging: where executors stage rows (a path every executor sees).
        lease: the database of the leadership lease.
        lease_from: the key ``lease`` was read from (``run.lease_dsn``, or a
            sink's ``sinks.NAME.dsn``).
        trigger: as written (``"1 second"``, ``"available-now"``), or None.
        via: "auto", "executors" or "driver" (see ``reconcile.spark.StreamWriter``).
        collect_max_bytes: with ``via="auto"``, the largest micro-batch (Spark's
            estimate of its input) collected to the driver; None: the default.
        lease_term_s: how long a lease lasts without renewal.
        master: the Spark master.
        spark: Spark conf, (key, value) in file order.
        logic_version: the name of the app's logic (default: ``app``). After a
            rebuild (``reconcile rebuild``) only a run of the rebuild's logic
            version may write the pipeline.
        rebuild_input: a folder (or file) of the stream's retained input that
            ``reconcile rebuild`` reads whole through the app, for a source whose
            checkpoint keeps no file list; "": the checkpoint's file list.
        realtime: Real-Time Mode's batch duration (``"5 seconds"``), or None: micro-batches.
        rows_per_txn: under Real-Time Mode, the most rows one sink transaction holds.
        ms_per_txn: under Real-Time Mode, the age of its oldest row at which it commits.
        writer: under Real-Time Mode, the ``foreach`` writer, ``"jvm"`` or ``"python"``.
    """

    app: str
    checkpoint: str
    staging: str
    lease: Connection
    lease_from: str
    trigger: str | None = None
    via: str = "auto"
    collect_max_bytes: int | None = None
    lease_term_s: float = DEFAULT_TERM_S
    master: str = DEFAULT_MASTER
    spark: tuple[tuple[str, str], ...] = ()
    logic_version: str = ""
    rebuild_input: str = ""
    realtime: str | None = None
    rows_per_txn: int = 100
    ms_per_txn: int = 100
    writer: str = "jvm"

    @property
    def logic(self) -> str:
        """The logic version writers of this run table run: ``logic_version``, else ``app``."""
        return self.logic_version or self.app

    @property
    def trigger_args(self) -> dict[str, Any] | None:
        """``DataStreamWriter.trigger`` keyword arguments, or None (no trigger)."""
        if self.trigger is None:
            return None
        if self.trigger == AVAILABLE_NOW:
            return {"availableNow": True}
        return {"processingTime": self.trigger}

    @property
    def spark_conf(self) -> dict[str, str]:
        """The Spark conf as a dict."""
        return dict(self.spark)


def provides(connection: Connection, capability: str) -> bool:
    """Whether the sink backend of ``connection`` provides ``capability`` (``sinks.base``).

    The backend is found by the connection's form (its scheme, or libpq's
    key=value), which the redacted text shows as well as the secret one.
    """
    return registry.provides(connection.display, capability)


def read_run(
    reader: TableReader,
    base: Path,
    sinks: Sequence[tuple[str, Connection]],
    env: Mapping[str, str],
) -> RunSettings:
    """Read a ``run`` table.

    Args:
        reader: the table.
        base: the config file's folder.
        sinks: (the sink's key, e.g. ``sinks.lines.dsn``, its connection), in
            file order: the lease's database by default.
        env: where ``${VAR}`` in ``lease_dsn`` is looked up.
    """
    reader.only(*RUN_KEYS)
    app = reader.get("app", str, required=True)
    if not _APP.fullmatch(app):
        raise reader.error(f'expected "package.module:function", got {app!r}', "app")
    logic_version = _nonempty(reader, "logic_version") or ""
    rebuild_input = _nonempty(reader, "rebuild_input")
    rebuild_input = local_path(rebuild_input, base) if rebuild_input else ""
    checkpoint = _nonempty(reader, "checkpoint", required=True)
    assert checkpoint is not None
    checkpoint = local_path(checkpoint, base)
    staging = _staging(reader, checkpoint, base)
    trigger = reader.get("trigger", str)
    if trigger is not None and trigger != AVAILABLE_NOW and not _DURATION.fullmatch(trigger):
        raise reader.error(
            f'expected a duration such as "1 second" or "500 milliseconds", or '
            f'"{AVAILABLE_NOW}", got {trigger!r}',
            "trigger",
        )
    via = choice(reader, "via", VIA, "auto")
    collect_max_bytes = reader.get("collect_max_bytes", int)
    if collect_max_bytes is not None and collect_max_bytes < 0:
        raise reader.error(f"must be >= 0, got {collect_max_bytes}", "collect_max_bytes")
    term = reader.get("lease_term_s", (int, float))
    if term is not None and not term > 0:
        raise reader.error(f"must be > 0, got {term}", "lease_term_s")
    lease, lease_from = _lease(reader, sinks, env)
    master = _nonempty(reader, "master") or DEFAULT_MASTER
    realtime = _realtime(reader, sinks)
    spark = _spark(reader.table("spark"))
    reader.done()
    return RunSettings(
        app=app,
        checkpoint=checkpoint,
        staging=staging,
        lease=lease,
        lease_from=lease_from,
        trigger=trigger,
        via=via,
        collect_max_bytes=collect_max_bytes,
        lease_term_s=float(term) if term is not None else DEFAULT_TERM_S,
        master=master,
        spark=spark,
        logic_version=logic_version,
        rebuild_input=rebuild_input,
        **realtime,
    )


def _realtime(reader: TableReader, sinks: Sequence[tuple[str, Connection]]) -> dict[str, Any]:
    """The Real-Time Mode keys, checked against the rest of the table and the sinks."""
    realtime = _nonempty(reader, "realtime")
    tuning = {key: reader.get(key, int) for key in ("rows_per_txn", "ms_per_txn")}
    writer = reader.get("writer", str)
    if realtime is None:
        given = [key for key, value in (*tuning.items(), ("writer", writer)) if value is not None]
        if given:
            raise reader.error(
                'is Real-Time Mode\'s: set realtime (the batch duration, e.g. "5 seconds") '
                "or remove it",
                given[0],
            )
        return {}
    if not _DURATION.fullmatch(realtime):
        raise reader.error(f'expected a duration such as "5 seconds", got {realtime!r}', "realtime")
    for key in MICRO_BATCH_KEYS:
        if reader.get(key, object) is not None:
            raise reader.error(
                f"is the micro-batch writer's, and realtime is set: Real-Time Mode runs long "
                f"batches of {realtime} with no trigger of its own; remove one of them",
                key,
            )
    for key, value in tuning.items():
        if value is not None and value < 1:
            raise reader.error(f"must be >= 1, got {value}", key)
    if writer is not None and writer not in REALTIME_WRITERS:
        raise reader.error(f"expected one of {list(REALTIME_WRITERS)}, got {writer!r}", "writer")
    # WHY one PostgreSQL sink: the offset markers that make a replayed record land once
    # live in the sink's own database, in the transaction that writes its rows; a second
    # sink would need a transaction across both.
    if len(sinks) != 1 or not provides(sinks[0][1], REALTIME):
        shown = ", ".join(key for key, _ in sinks)
        raise reader.error(
            f"needs exactly one sink whose database keeps offset markers (PostgreSQL), in the "
            f"same transaction as its rows; the pipeline has {shown}",
            "realtime",
        )
    return {
        "realtime": realtime,
        "rows_per_txn": tuning["rows_per_txn"] or 100,
        "ms_per_txn": tuning["ms_per_txn"] or 100,
        "writer": writer or "jvm",
    }


def _nonempty(reader: TableReader, key: str, *, required: bool = False) -> str | None:
    value: str | None = reader.get(key, str, required=required)
    if value is not None and not value.strip():
        raise reader.error("must not be empty", key)
    return value


def _staging(reader: TableReader, checkpoint: str, base: Path) -> str:
    staging = _nonempty(reader, "staging")
    if staging is None:
        if "://" in checkpoint:
            raise reader.error(
                "is required when the checkpoint is a URI (staging must be a folder that the "
                "driver and every executor see at the same path)",
                "staging",
            )
        return str(Path(checkpoint).with_name(Path(checkpoint).name + ".staging"))
    if "://" in staging:
        raise reader.error(
            "expected a folder that the driver and every executor see at the same path, not a URI",
            "staging",
        )
    return local_path(staging, base)


def _lease(
    reader: TableReader, sinks: Sequence[tuple[str, Connection]], env: Mapping[str, str]
) -> tuple[Connection, str]:
    template = _nonempty(reader, "lease_dsn")
    if template is not None:
        return fill_connection(reader, "lease_dsn", "dsn", template, None, env), reader.key(
            "lease_dsn"
        )
    for key, connection in sinks:
        if provides(connection, LEASE):
            return connection, key
    raise reader.error(
        "is required: no sink of this pipeline has a Postgres connection, and the lease is a "
        "row in a Postgres database",
        "lease_dsn",
    )


def _spark(reader: TableReader | None) -> tuple[tuple[str, str], ...]:
    if reader is None:
        return ()
    conf = tuple((key, reader.get(key, str)) for key in list(reader.data))
    for key, _ in conf:
        if not key.strip():
            raise reader.error("a Spark conf key must not be empty", key)
    reader.done()
    return conf
