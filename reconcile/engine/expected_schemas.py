"""What the expected state learns of its sinks' tables, and the schema changes it plans.

:class:`SinkSchemas` is the part of :class:`~reconcile.engine.expected.ExpectedState`
that compares schemas: the sink tables' column types read at start-up
(``take_sink_types``; a column the store has and a sink table lacks, left by
a crash between the two commits of an epoch that added it, is handed to the
sink there), and the change an epoch's rows ask of a store table (``_plan``,
``reconcile.engine.schema_plan``).
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.column_types import check_column_names, check_store_types
from expected_state.store import ExpectedStateStore
from reconcile.core.contract import Change, ConfigurationError
from reconcile.core.schema_change import SchemaChange
from reconcile.engine.schema_plan import (
    brought_schema,
    check_sink_columns,
    pending_sink_change,
    plan_epoch_change,
)

__all__ = ["SinkSchemas"]


class SinkSchemas:
    """Mixin for :class:`~reconcile.engine.expected.ExpectedState`: sink types, schema changes."""

    schemas: dict[str, pa.Schema]
    sink_types: dict[str, pa.Schema]

    @property
    def tables(self) -> dict[str, ExpectedStateStore]:  # provided by ExpectedState
        raise NotImplementedError

    def take_sink_types(self, sinks: Mapping[str, object]) -> None:
        """Learn each keyed sink's column types from its table (after the sinks are bound).

        A sink says them with ``arrow_schema()`` (an Arrow schema, or None when
        it has no table); a sink without the method has none. A new store table
        takes them; an existing one (without ``schemas=``) is checked against
        them. Idempotent.

        Raises:
            ConfigurationError: an existing store table with a column that
                cannot hold every value of the sink's column, naming it and
                both types (a later epoch would otherwise be refused midway).
            ForeignSchemaChange: a store column that someone dropped from the
                sink's table, or changed to a type verify cannot compare with
                the store's, naming it (``schema_plan``).
            ReconcileError: from a sink's ``arrow_schema()``.
        """

        for name, store in self.tables.items():
            sink = sinks.get(name)
            reader = getattr(sink, "arrow_schema", None)
            types = reader() if reader is not None else None
            if types is None:
                continue
            if not isinstance(types, pa.Schema):
                raise ConfigurationError(
                    f"sink {name!r}: arrow_schema() returned {type(types).__name__}, "
                    "not a pyarrow.Schema or None"
                )
            check_column_names(types.names, table=store.uri)
            self.sink_types[name] = types
            store.column_types = types
            if name not in self.schemas and store.user_schema is not None:
                check_store_types(store.user_schema, types, table=store.uri, sink=name)
            if store.user_schema is None:
                continue
            # Every column of the sink's table, as verify reads them (a sink
            # without recovery_columns() says only the columns it types).
            lister = getattr(sink, "recovery_columns", None)
            columns = lister() if lister is not None else None
            if columns is not None:
                check_sink_columns(store.user_schema, columns, table=store.uri, sink=name)
            evolve = getattr(sink, "evolve_schema", None)
            if evolve is not None:
                # A crash between the store's commit of an epoch that added a
                # column and the sink's commit of it leaves the column in the
                # store only: the epoch's replay adds it to the sink first.
                names = types.names if columns is None else list(columns)
                pending = pending_sink_change(store.user_schema, names, table=store.uri, sink=name)
                if pending is not None:
                    evolve(pending)

    def _plan(
        self, sink: str, store: ExpectedStateStore, given: list[Change] | pa.Table
    ) -> SchemaChange | None:
        """The schema change ``given`` asks of an existing store table (``schema_plan``)."""
        schema = store.current_schema()
        if schema is None:
            return None  # a first epoch creates the table with what it brings
        types = self.sink_types.get(sink)
        return plan_epoch_change(
            schema,
            brought_schema(given, types, store.uri, schema),
            self.schemas.get(sink),
            store.key_columns,
            types,
            table=store.uri,
        )
