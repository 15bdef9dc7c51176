"""Every object the engine creates in a user's database, declared once: its name, DDL, definition.

Nothing else in the engine holds a ``CREATE`` statement (a unit test scans the
source for one): code that needs one of these objects asks ``sinks.objects``,
which creates it from the DDL here, schema-qualified, and checks it against
the definition here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from reconcile.core.staged import STAGE_EPOCH_COLUMN, STAGE_TASK_COLUMN

__all__ = [
    "ADD_EPOCH_COLUMN",
    "CREATE_EPOCH_INDEX",
    "CREATE_SCHEMA",
    "CREATE_SESSION_STAGE",
    "CREATE_STAGE",
    "CREATE_STAGE_INDEX",
    "DDL",
    "ENGINE_SCHEMA",
    "EPOCH_COLUMN",
    "FENCES",
    "LEASES",
    "MARKERS",
    "MAX_COLUMNS",
    "REALTIME_OFFSETS",
    "REPAIRS",
    "SESSION_SCHEMA",
    "STAGE_EXTRA_COLUMNS",
    "STATE_TABLES",
    "TableDecl",
    "epoch_index_name",
    "session_stage_name",
    "stage_columns",
    "stage_name",
]

# The engine's own schema in every database it writes: its tables live here,
# schema-qualified, and are never found through the search_path.
ENGINE_SCHEMA = "reconcile"

# Session temp tables are qualified with this, never left to the search_path.
SESSION_SCHEMA = "pg_temp"

# PostgreSQL's limit of columns in one table.
MAX_COLUMNS = 1600

# The column the sink fills with the epoch that last wrote each row, in the
# user's target (added on request, ``create_epoch_column=True``).
EPOCH_COLUMN = "_epoch"

CREATE_SCHEMA = "CREATE SCHEMA {schema}"


@dataclass(frozen=True)
class TableDecl:
    """A table of fixed definition in the engine's schema.

    ``columns`` maps each column to (``format_type()``, NOT NULL): a table found
    in the database must have exactly these, and ``key`` as its primary key.
    ``ddl`` has one placeholder, ``{table}``, the schema-qualified name.
    """

    name: str
    ddl: str
    columns: dict[str, tuple[str, bool]]
    key: tuple[str, ...]
    persistence: str = "p"  # pg_class.relpersistence: 'p' logged, 'u' unlogged


# The markers: one row per committed epoch, written in the epoch's own txn.
MARKERS = TableDecl(
    "reconcile_commits",
    """
CREATE TABLE {table} (
    pipeline      text        NOT NULL,
    sink          text        NOT NULL,
    epoch         bigint      NOT NULL,
    target_schema text        NOT NULL,
    target_table  text        NOT NULL,
    log_id        text,
    xid           xid8        NOT NULL,
    backend_pid   integer     NOT NULL,
    generation    bigint      NOT NULL,
    row_count     bigint      NOT NULL,
    committed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pipeline, sink, epoch)
)""",
    {
        "pipeline": ("text", True),
        "sink": ("text", True),
        "epoch": ("bigint", True),
        "target_schema": ("text", True),
        "target_table": ("text", True),
        "log_id": ("text", False),  # NULL: written by a sink not bound to a progress log
        "xid": ("xid8", True),
        "backend_pid": ("integer", True),
        "generation": ("bigint", True),
        "row_count": ("bigint", True),
        "committed_at": ("timestamp with time zone", True),
    },
    ("pipeline", "sink", "epoch"),
)

# The fences: the newest writer generation of each (pipeline, sink).
FENCES = TableDecl(
    "reconcile_fences",
    """
CREATE TABLE {table} (
    pipeline   text        NOT NULL,
    sink       text        NOT NULL,
    generation bigint      NOT NULL,
    log_id     text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, sink)
)""",
    {
        "pipeline": ("text", True),
        "sink": ("text", True),
        "generation": ("bigint", True),
        "log_id": ("text", False),
        "updated_at": ("timestamp with time zone", True),
    },
    ("pipeline", "sink"),
)

# One row per pull-and-diff repair transaction, written in that transaction:
# it records a repair of an epoch whose marker exists already (markers are one
# per epoch), and its xid settles an ambiguous COMMIT of it.
REPAIRS = TableDecl(
    "reconcile_repairs",
    """
CREATE TABLE {table} (
    pipeline      text        NOT NULL,
    sink          text        NOT NULL,
    xid           xid8        NOT NULL,
    epoch         bigint      NOT NULL,
    target_schema text        NOT NULL,
    target_table  text        NOT NULL,
    log_id        text,
    backend_pid   integer     NOT NULL,
    generation    bigint      NOT NULL,
    mode          text        NOT NULL,
    missing       bigint      NOT NULL,
    extra         bigint      NOT NULL,
    changed       bigint      NOT NULL,
    applied       bigint      NOT NULL,
    repaired_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pipeline, sink, xid)
)""",
    {
        "pipeline": ("text", True),
        "sink": ("text", True),
        "xid": ("xid8", True),
        "epoch": ("bigint", True),
        "target_schema": ("text", True),
        "target_table": ("text", True),
        "log_id": ("text", False),
        "backend_pid": ("integer", True),
        "generation": ("bigint", True),
        "mode": ("text", True),
        "missing": ("bigint", True),
        "extra": ("bigint", True),
        "changed": ("bigint", True),
        "applied": ("bigint", True),
        "repaired_at": ("timestamp with time zone", True),
    },
    ("pipeline", "sink", "xid"),
)

STATE_TABLES = (MARKERS, FENCES, REPAIRS)

# A pipeline's leadership lease (sinks.postgres.lease): one row per pipeline.
LEASES = TableDecl(
    "reconcile_leases",
    """
CREATE TABLE {table} (
    pipeline    text        PRIMARY KEY,
    holder      text        NOT NULL,
    tenure      bigint      NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    backend_pid integer
)""",
    {
        "pipeline": ("text", True),
        "holder": ("text", True),
        "tenure": ("bigint", True),
        "acquired_at": ("timestamp with time zone", True),
        "renewed_at": ("timestamp with time zone", True),
        "expires_at": ("timestamp with time zone", True),
        "backend_pid": ("integer", False),  # the holder's lease session
    },
    ("pipeline",),
)

# The executors' staging table of one (pipeline, sink, target): UNLOGGED, the
# target's columns (no constraints) plus the epoch and the task attempt that
# COPied each row. {columns} are the target's, {target} the target itself.
CREATE_STAGE = (
    "CREATE UNLOGGED TABLE {table} AS SELECT {columns}, NULL::bigint AS {epoch}, "
    "NULL::text AS {task} FROM {target} WITH NO DATA"
)
CREATE_STAGE_INDEX = "CREATE INDEX {index} ON {table} ({epoch}, {task})"
STAGE_EXTRA_COLUMNS: dict[str, tuple[str, bool]] = {
    STAGE_EPOCH_COLUMN: ("bigint", False),
    STAGE_TASK_COLUMN: ("text", False),
}

# A session's own temp table of (target, columns), reused by every epoch of the
# session: ON COMMIT DELETE ROWS empties it at each commit without a catalog
# write (transactional mode; apply.py).
CREATE_SESSION_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS {table} ON COMMIT DELETE ROWS AS "
    "SELECT {columns} FROM {target} WITH NO DATA"
)

# On request only: the target's ``_epoch`` column, and its index (an index lives
# in its table's schema, so this one is in the target's).
ADD_EPOCH_COLUMN = "ALTER TABLE {target} ADD COLUMN IF NOT EXISTS {column} bigint"
CREATE_EPOCH_INDEX = "CREATE INDEX IF NOT EXISTS {index} ON {target} ({column})"


def _digest(parts: Sequence[str]) -> str:
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).hexdigest()


def stage_name(
    pipeline: str, sink: str, target: tuple[str, str], columns: Sequence[tuple[str, str]]
) -> str:
    """The staging table's name for (pipeline, sink) writing ``target`` with ``columns``.

    One table per (pipeline, sink, target): another pipeline writing the same
    target has its own, so neither reads nor sweeps the other's rows. The
    column names and types are in the digest too, so a target whose columns
    changed gets a new table, never a stale one.

    Args:
        pipeline: the pipeline's name.
        sink: the sink's name in the pipeline.
        target: (schema, table) of the target.
        columns: (name, format_type()) of the staged columns, in order.
    """
    typed = [f"{name}:{sql_type}" for name, sql_type in columns]
    return "_reconcile_stage_" + _digest([pipeline, sink, *target, *typed])


def stage_columns(columns: Sequence[tuple[str, str]]) -> dict[str, tuple[str, bool]]:
    """The staging table's expected columns: the staged ones, nullable, then its own two."""
    return {name: (sql_type, False) for name, sql_type in columns} | STAGE_EXTRA_COLUMNS


def session_stage_name(
    kind: str, target: tuple[str, str], columns: Sequence[tuple[str, str]]
) -> str:
    """The unqualified name of a session's temp table for (target, columns); ``kind`` u or d."""
    typed = [f"{name}:{sql_type}" for name, sql_type in columns]
    return f"_reconcile_{kind}_" + _digest([*target, *typed])


def epoch_index_name(table: str) -> str:
    """The name of the ``_epoch`` index of ``table`` (in the table's schema)."""
    return f"{table[:40]}_reconcile_epoch"


# Real-Time Mode's markers (reconcile.spark.realtime): per Kafka topic-partition, the highest
# offset whose row is in the target, upserted in the same transaction as those rows, and
# the generation of the task that wrote them (a newer one fences an older one).
REALTIME_OFFSETS = TableDecl(
    "reconcile_realtime_offsets",
    """
CREATE TABLE {table} (
    pipeline        text        NOT NULL,
    sink            text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    last_offset     bigint      NOT NULL,
    generation      bigint      NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pipeline, sink, topic, kafka_partition)
)""",
    {
        "pipeline": ("text", True),
        "sink": ("text", True),
        "topic": ("text", True),
        "kafka_partition": ("integer", True),
        "last_offset": ("bigint", True),
        "generation": ("bigint", True),
        "updated_at": ("timestamp with time zone", True),
    },
    ("pipeline", "sink", "topic", "kafka_partition"),
)

# Every statement above that creates something: the source scan holds the
# engine to these (tests/unit/test_creates_declared.py).
DDL = (
    CREATE_SCHEMA,
    *(t.ddl for t in (*STATE_TABLES, LEASES, REALTIME_OFFSETS)),
    CREATE_STAGE,
    CREATE_STAGE_INDEX,
    CREATE_SESSION_STAGE,
    ADD_EPOCH_COLUMN,
    CREATE_EPOCH_INDEX,
)
