"""The PostgreSQL backend, as it declares itself to ``sinks.registry``.

Its sinks write through psycopg (COPY, a marker and the fence in the epoch's
transaction); recovery pulls with COPY into Arrow through ADBC and checksums
buckets in the database; Spark's executors pull and stage through it; the HA
lease is a row in its database; Real-Time Mode's small transactions carry
Kafka offset markers.
"""

from __future__ import annotations

import re

from sinks.base import (
    LEASE,
    PULLABLE,
    REALTIME,
    REALTIME_JDBC,
    SHARED_STAGE,
    SPARK_PULL,
    TABLE_SINK,
    Backend,
)

__all__ = ["BACKEND", "is_postgres_connection"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# SQLAlchemy's form, with any driver: the sink connects with psycopg whatever it names.
_DRIVER_URL = re.compile(r"^postgres(ql)?\+\w+://", re.IGNORECASE)


def is_postgres_connection(connection: str) -> bool:
    """A libpq ``key=value`` string (``host=db dbname=shop``) or a ``postgresql+driver://`` URL."""
    text = connection.strip()
    return bool(_DRIVER_URL.match(text)) or (not _URL.match(text) and "=" in text)


BACKEND = Backend(
    name="postgres",
    # libpq's schemes; SQLAlchemy's postgresql+driver:// and libpq's
    # key=value strings are taken by ``accepts``.
    schemes=("postgresql", "postgres"),
    open="sinks.postgres.factory:open_uri",
    extra="postgres",
    requires=("psycopg", "adbc_driver_postgresql"),
    capabilities={
        PULLABLE: "sinks.postgres.sink:PostgresSink",
        SPARK_PULL: "sinks.postgres.sink:PostgresSink",
        TABLE_SINK: "sinks.postgres.factory:postgres_sink",
        LEASE: "sinks.postgres.lease:PgLease",
        SHARED_STAGE: "sinks.postgres.shared_stage:PgSharedStage",
        REALTIME: "sinks.postgres.realtime:open_realtime_writer",
        REALTIME_JDBC: "sinks.postgres.realtime:jdbc_connection",
    },
    accepts=is_postgres_connection,
)
