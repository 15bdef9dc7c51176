"""What Real-Time Mode's writer needs of a backend: the records, the target, the writer's protocol.

Spark's Real-Time Mode (``reconcile.spark.realtime``) commits Kafka records in
small transactions, each with its topic-partitions' offset markers; a backend
that can do so provides ``sinks.base.REALTIME`` (through ``sinks.registry``):
a callable that takes a :class:`RealtimeTarget` and returns a
:class:`RealtimeWriter`. PostgreSQL's is ``sinks.postgres.realtime``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from reconcile.core.contract import ConfigurationError, validate_name
from sinks.objects.declared import ENGINE_SCHEMA

__all__ = ["OffsetRecord", "RealtimeTarget", "RealtimeWriter"]


@dataclass(frozen=True, slots=True)
class OffsetRecord:
    """One Kafka record to write: where it came from, and the target row's values."""

    topic: str
    partition: int
    offset: int
    values: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class RealtimeTarget:
    """Where the rows go and under which names their markers are kept (picklable).

    ``dsn`` is a connection string, never logged (it may hold a password).
    """

    dsn: str
    table: str
    columns: tuple[str, ...]
    pipeline: str
    sink: str
    schema: str = "public"
    state_schema: str = ENGINE_SCHEMA

    def __post_init__(self) -> None:
        validate_name("pipeline", self.pipeline)
        validate_name("sink", self.sink)
        if not self.columns:
            raise ConfigurationError(
                f"real-time sink {self.sink}: no columns to write into {self.schema}.{self.table}"
            )

    def __repr__(self) -> str:  # the DSN may hold a password
        return f"RealtimeTarget({self.schema}.{self.table}, {self.pipeline}/{self.sink})"


class RealtimeWriter(Protocol):
    """One task's writer: small transactions of records with their offset markers."""

    def commit(self, records: Sequence[OffsetRecord]) -> int:
        """Write the records past their partitions' markers, and the markers; rows written."""
        ...

    def marker_check(self) -> tuple[str, str]:
        """A query a JVM task runs on the marker table, and the answer the driver vetted."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...
