"""Small PostgreSQL transactions of Kafka records, each carrying its topic-partitions' offsets.

Spark's Real-Time Mode runs long batches whose tasks see rows as they arrive,
and replays a batch from its start offsets after a failure. Here each small
transaction inserts its rows into the target and, in the same transaction,
upserts one marker per Kafka topic-partition it covers (the highest offset
written and the writer's generation) in ``reconcile.reconcile_realtime_offsets``.
A replayed row at or below its partition's marker is skipped, so each record
lands once; a writer whose generation is older than the marker's is fenced:
its transaction rolls back and it stops.

No Spark here: ``reconcile.spark.realtime`` drives it from a ``foreach`` writer, through
``sinks.registry`` (the ``realtime`` capability, :func:`open_realtime_writer`). The JVM
writer (``jvm/realtime-writer``, the same transactions in Java) connects through the JDBC
driver: :func:`jdbc_connection` turns the target's DSN into its URL and properties.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from reconcile.core.contract import ConfigurationError, FencedError
from sinks.objects.catalog import RELATION_FACTS_SQL
from sinks.objects.postgres import open_realtime_offsets, vet_realtime_offsets
from sinks.postgres.connection import PgTarget
from sinks.realtime import OffsetRecord, RealtimeTarget

__all__ = ["JDBC_PROPERTIES", "RealtimeTxnWriter", "jdbc_connection", "open_realtime_writer"]

# libpq's connection parameters the JDBC driver takes, by its own names (host, port and
# dbname go into the URL).
JDBC_PROPERTIES = {
    "user": "user",
    "password": "password",
    "sslmode": "sslmode",
    "gssencmode": "gssEncMode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "application_name": "ApplicationName",
    "connect_timeout": "connectTimeout",
    "options": "options",
}

# The JVM writer's socket, whatever the DSN says: TCP keepalives, and a read that gets no
# byte for this long fails. A transaction holds at most a few hundred rows and waits for
# a marker's lock only while another task's small transaction holds it: seconds at most.
JDBC_SOCKET_TIMEOUT_S = 120
JDBC_SOCKET_DEFAULTS = {"tcpKeepAlive": "true", "socketTimeout": str(JDBC_SOCKET_TIMEOUT_S)}


class RealtimeTxnWriter:
    """One task's writer: claims a generation per topic-partition, commits rows with markers.

    Args:
        target: the table, its columns and the marker names.
        conn: an open connection (autocommit); the writer runs its own transactions on it.
    """

    def __init__(self, target: RealtimeTarget, conn: psycopg.Connection[Any]) -> None:
        self.target = target
        self.conn = conn
        what = f"real-time sink {target.sink}"
        self.markers = open_realtime_offsets(conn, target.state_schema, what=what)
        self.generations: dict[tuple[str, int], int] = {}
        self.insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(target.schema, target.table),
            sql.SQL(", ").join(map(sql.Identifier, target.columns)),
            sql.SQL(", ").join(sql.Placeholder() * len(target.columns)),
        )

    def _marker(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(last_offset, generation) of the partition's marker, locked for this transaction."""
        row = self.conn.execute(
            sql.SQL(
                "SELECT last_offset, generation FROM {} WHERE pipeline = %s AND sink = %s "
                "AND topic = %s AND kafka_partition = %s FOR UPDATE"
            ).format(self.markers),
            (self.target.pipeline, self.target.sink, topic, partition),
        ).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def _upsert(self, topic: str, partition: int, offset: int, generation: int) -> None:
        self.conn.execute(
            sql.SQL(
                "INSERT INTO {} (pipeline, sink, topic, kafka_partition, last_offset, generation)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (pipeline, sink, topic, "
                "kafka_partition) DO UPDATE SET last_offset = EXCLUDED.last_offset, "
                "generation = EXCLUDED.generation, updated_at = clock_timestamp()"
            ).format(self.markers),
            (self.target.pipeline, self.target.sink, topic, partition, offset, generation),
        )

    def commit(self, records: Sequence[OffsetRecord]) -> int:
        """Write ``records`` and their partitions' markers in one transaction; rows written.

        Raises:
            FencedError: a newer writer claimed one of the partitions (nothing written).
        """
        by_partition: dict[tuple[str, int], list[OffsetRecord]] = {}
        for record in records:
            by_partition.setdefault((record.topic, record.partition), []).append(record)
        written = 0
        with self.conn.transaction():
            for (topic, partition), group in sorted(by_partition.items()):
                marker = self._marker(topic, partition)  # locked until COMMIT
                last, newest = marker if marker is not None else (-1, 0)
                mine = self.generations.get((topic, partition))
                if mine is None:
                    # This task's first transaction on the partition: it claims the next
                    # generation, which fences any older task still writing it (a zombie
                    # of a failed batch, or of a driver that died).
                    mine = self.generations[(topic, partition)] = newest + 1
                elif newest > mine:
                    # A newer task claimed the partition since: this one is a zombie.
                    # Raising inside the transaction rolls back its rows with it.
                    raise FencedError(
                        f"real-time sink {self.target.sink}: {topic}[{partition}] was claimed "
                        f"by generation {newest}; this writer has {mine} and stops "
                        "(nothing of this transaction was written)",
                        topic=topic,
                        partition=partition,
                        generation=mine,
                        newer=newest,
                    )
                # A replay: Spark re-runs a batch from its start offsets, and the rows at
                # or below the marker are in the target already (committed with it).
                fresh = [r for r in group if r.offset > last]
                if fresh:
                    with self.conn.cursor() as cur:
                        cur.executemany(self.insert, [r.values for r in fresh])
                    written += len(fresh)
                high = max([last, *(r.offset for r in fresh)])
                self._upsert(topic, partition, high, mine)
        return written

    def covered(self, topic: str, partition: int) -> int | None:
        """The highest offset of ``topic[partition]`` in the target (None: none yet)."""
        row = self.conn.execute(
            sql.SQL(
                "SELECT last_offset FROM {} WHERE pipeline = %s AND sink = %s "
                "AND topic = %s AND kafka_partition = %s"
            ).format(self.markers),
            (self.target.pipeline, self.target.sink, topic, partition),
        ).fetchone()
        return None if row is None else int(row[0])

    def marker_check(self) -> tuple[str, str]:
        """What the JVM writer's tasks run on the marker table, and the answer they require.

        The checks run here (on the driver) and the catalog facts they passed on are
        read in the same snapshot; each JVM task reads the facts again with the same
        query (``MarkerWriter.open``) and refuses the table unless they are the same.

        Raises:
            ConfigurationError: the markers are refused (named, with every finding).
        """
        what = f"real-time sink {self.target.sink}"
        facts = vet_realtime_offsets(self.conn, self.target.state_schema, what=what)
        return RELATION_FACTS_SQL.replace("%s", "?"), facts  # JDBC's placeholders

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


def open_realtime_writer(target: RealtimeTarget) -> RealtimeTxnWriter:
    """Connect to ``target`` (autocommit) and bind its marker table; the writer owns the connection.

    Raises:
        ConfigurationError: the marker table is refused (named, with every finding).
    """
    # Through PgTarget: the engine's session settings (UTC, ISO dates, ...) whatever the
    # server's defaults, and the password kept out of any error.
    conn = PgTarget.parse(target.dsn).connect(autocommit=True)
    try:
        return RealtimeTxnWriter(target, conn)
    except BaseException:
        conn.close()
        raise


def jdbc_connection(dsn: str, what: str) -> tuple[str, dict[str, str]]:
    """The JDBC URL (no secret in it) and connection properties of a libpq DSN.

    The engine's session settings (UTC, ISO dates, ...) go into ``options``, as for
    every connection of the engine.

    Raises:
        ConfigurationError: a Unix socket, several hosts, or a parameter the JDBC
            driver has no name for (each named; the DSN itself is never shown).
    """
    conninfo = conninfo_to_dict(PgTarget.parse(dsn).conninfo())
    params = {k: str(v) for k, v in conninfo.items() if v}
    host = params.pop("hostaddr", None) or params.pop("host", None) or "localhost"
    params.pop("host", None)
    if host.startswith("/") or "," in host:
        # The JDBC driver speaks TCP to one server; a socket folder or a host list would
        # need what it does not have.
        raise ConfigurationError(
            f"{what}: the JVM writer connects over TCP to one host, not to {host!r}; "
            "give host= a host name or address (or use writer='python')"
        )
    port = params.pop("port", "5432")
    dbname = params.pop("dbname", None) or params.get("user") or "postgres"
    unknown = sorted(set(params) - set(JDBC_PROPERTIES))
    if unknown:
        raise ConfigurationError(
            f"{what}: the JVM writer cannot pass the connection parameter(s) "
            f"{', '.join(unknown)} to the JDBC driver; leave them out or use writer='python'",
            parameters=unknown,
        )
    bracketed = f"[{host}]" if ":" in host else host
    url = f"jdbc:postgresql://{bracketed}:{port}/{quote(dbname, safe='')}"
    # WHY both: without them a task whose server vanished without closing the socket (a
    # host lost, a network cut) waits on its read forever, holding its slot for the whole
    # long batch; with them its commit fails, the task fails and Spark runs it again.
    return url, {**JDBC_SOCKET_DEFAULTS, **{JDBC_PROPERTIES[k]: v for k, v in params.items()}}
