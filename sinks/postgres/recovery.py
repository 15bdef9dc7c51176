"""A Postgres sink table as a recovery target: reflect, pull (ADBC COPY), checksum, repair.

Built either from a sink client the commit cycle already holds (bound to its
writer, with its generation), or from a DSN for an operator's ``verify`` /
``repair``. A verify only reads: it creates no state table and writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.conform import SinkColumn
from reconcile.core.contract import ConfigurationError
from reconcile.core.target import Repair, RepairTurn
from sinks.objects.declared import ENGINE_SCHEMA

from .binding import connect_checked
from .client import PgSinkClient
from .heavy import DEFAULT_STATEMENT_TIMEOUT_MS
from .markers import MARKERS_TABLE, REPAIRS_TABLE
from .pull import MarkerSource, PgSnapshot
from .pull_columns import sink_columns
from .repair import apply_repair
from .repair_turn import repair_turn
from .schema import TableSchema, reflect_table

__all__ = ["PgRecoveryTarget"]


class PgRecoveryTarget:
    """The ``RecoveryTarget`` of one Postgres sink table.

    Args:
        sink: the sink client (a ``PostgresSink``; bound by the commit cycle, or
            built directly for an operator's repair).
        pipeline: whose markers and fence row.
        generation: the writer generation the repair is fenced with (the
            commit cycle's); None: an operator's repair, for the fence's owner.
        write: whether a repair may follow; False (verify) reads only.
    """

    bucket_checksums = True

    def __init__(
        self, sink: PgSinkClient, pipeline: str, generation: int | None, *, write: bool
    ) -> None:
        self.sink, self.pipeline, self.generation, self.write = sink, pipeline, generation, write
        self._table: TableSchema | None = None
        self._marker_schema: str | None = None

    def _open(self) -> TableSchema:
        if self._table is not None:
            return self._table
        if self.write:
            # The sink's own start-up checks: the target, and the state tables
            # verified (created where missing) before the repair writes to them.
            self._table = self.sink.setup()
            state = self.sink._state
            assert state is not None
            self._marker_schema = state.schema
            what = f"repair of postgres sink {self.sink.name!r}"
            with connect_checked(self.sink.target, what, self.sink.application_name) as conn:
                found = conn.execute(
                    "SELECT to_regclass(%s)", (state.display(REPAIRS_TABLE),)
                ).fetchone()
            if found is None or found[0] is None:
                raise ConfigurationError(
                    f"{what}: {state.display(REPAIRS_TABLE)} does not exist and the sink's role "
                    "could not create it; create it as the schema's owner (its definition is in "
                    "docs/postgres.md) or grant CREATE on the schema, then repair again; nothing "
                    "was written"
                )
            return self._table
        what = f"verify of postgres sink {self.sink.name!r}"
        with connect_checked(self.sink.target, what, self.sink.application_name) as conn:
            self._table = reflect_table(
                conn, self.sink.options.schema, self.sink.table, self.sink.options.key_columns
            )
            candidates = (
                [self.sink.options.state_schema]
                if self.sink.options.state_schema
                else list(dict.fromkeys([ENGINE_SCHEMA, self._table.schema]))
            )
            for schema in candidates:
                found = conn.execute(
                    "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname = %s",
                    (schema, MARKERS_TABLE),
                ).fetchone()
                if found is not None:
                    self._marker_schema = schema
                    break
        return self._table

    @property
    def display(self) -> str:
        return self._open().display

    @property
    def epoch_column(self) -> bool:
        return self._open().has_epoch_column

    def columns(self) -> dict[str, SinkColumn]:
        return sink_columns(self._open())

    def key_columns(self) -> list[str]:
        return list(self._open().key)

    @contextmanager
    def snapshot(
        self,
        schema: pa.Schema,
        keys: list[str],
        *,
        shared: str | None = None,
        application_name: str | None = None,
    ) -> Iterator[PgSnapshot]:
        table = self._open()
        snap = PgSnapshot(
            self.sink.target,
            table,
            schema,
            keys,
            MarkerSource(self._marker_schema, self.pipeline, self.sink.name),
            shared=shared,
            application_name=application_name,
            statement_timeout_ms=self.sink.options.statement_timeout_ms,
        )
        with snap.opened() as opened:
            yield opened

    def apply(self, repair: Repair) -> int | None:
        return apply_repair(self.sink, self.pipeline, repair, self.generation)

    def take_repair_turn(self) -> AbstractContextManager[RepairTurn]:
        """Hold the table for one repair at a time (``repair_turn.py``)."""
        wait_ms = self.sink.options.statement_timeout_ms or DEFAULT_STATEMENT_TIMEOUT_MS
        return repair_turn(self.sink.target, self._open(), app=self.sink.application_name,
                           wait_ms=wait_ms)  # fmt: skip

    def close(self) -> None:
        """Close the sink client's connections (only for a client built for the repair)."""
        self.sink.close()

    def __repr__(self) -> str:
        return f"PgRecoveryTarget({self.sink!r})"
