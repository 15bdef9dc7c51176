"""Sink clients and commit cycles from a config file's sink tables.

The config-driven commands share these: ``verify`` / ``repair`` / ``watch``
(``reconcile.cli.watch``) split a table's ``schema.name`` with
:func:`split_table`; ``reconcile run`` (``reconcile.cli.run``) writes through
:func:`cycle_builder`, which makes a pipeline's ``CommitCycle`` over fresh
Postgres sink clients with an expected state keyed as the file says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from reconcile.cli.config_run import is_postgres
from reconcile.core.contract import ConfigurationError

if TYPE_CHECKING:
    from reconcile.cli.config import PipelineConfig, SinkTableConfig
    from reconcile.core.metrics import Metrics
    from reconcile.engine.cycle import CommitCycle
    from sinks.postgres import PostgresSink

__all__ = ["check_writable", "cycle_builder", "postgres_sink_of", "split_table"]


def split_table(table: str) -> tuple[str | None, str]:
    """``schema.name`` -> (schema, name); ``name`` -> (None, name)."""
    schema, dot, name = table.partition(".")
    return (schema, name) if dot else (None, table)


def check_writable(pipeline: PipelineConfig, file: object = None) -> None:
    """Refuse a sink table that ``reconcile run`` has no writing sink for.

    Raises:
        ConfigurationError: a sink given by a non-Postgres SQLAlchemy URL; the
            message names the config ``file`` (when given), the pipeline, the
            sink and its key.
    """
    for sink in pipeline.sinks:
        if not is_postgres(sink.connection):
            raise ConfigurationError(
                ("" if file is None else f"{file}: ")
                + f"pipelines.{pipeline.name}.sinks.{sink.name}.{sink.connection.kind}: "
                f"{sink.connection}: reconcile run writes Postgres sinks only (a libpq dsn, or "
                "a postgresql+driver:// url); verify and repair do read this one"
            )


def postgres_sink_of(sink: SinkTableConfig) -> PostgresSink:
    """A Postgres sink client for the table, in its ``write_mode``, keyed by its ``keys``."""
    from sinks.postgres import postgres_sink

    schema, table = split_table(sink.table)
    return postgres_sink(
        sink.connection.get_secret_value(),
        table,
        mode=sink.write_mode,
        name=sink.name,
        schema=schema,
        key=list(sink.keys),
    )


def cycle_builder(
    pipeline: PipelineConfig, *, metrics: Metrics | None = None, file: object = None
) -> Callable[[], CommitCycle]:
    """A ``build()`` for ``write_stream`` and ``HaNode``: a new cycle over new sink clients.

    The cycle's expected state is the pipeline's store, every sink keyed by
    its ``keys``; its epochs table is the progress log (shared by every
    instance that runs the pipeline).
    """
    check_writable(pipeline, file)

    def build() -> CommitCycle:
        from reconcile.engine.cycle import CommitCycle
        from reconcile.engine.expected import ExpectedState

        keys = {sink.name: list(sink.keys) for sink in pipeline.sinks}
        expected = ExpectedState(pipeline.store, pipeline.name, keys)
        sinks = [postgres_sink_of(sink) for sink in pipeline.sinks]
        return CommitCycle(pipeline.name, sinks, expected_state=expected, metrics=metrics)

    return build
