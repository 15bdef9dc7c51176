"""Sink clients and commit cycles from a config file's sink tables.

The config-driven commands share these: ``verify`` / ``repair`` / ``watch``
(``reconcile.cli.watch``) split a table's ``schema.name`` with
:func:`split_table`; ``reconcile run`` (``reconcile.cli.run``) writes through
:func:`cycle_builder`, which makes a pipeline's ``CommitCycle`` over fresh
sink clients (each from its backend, through ``sinks.registry``) with an
expected state keyed as the file says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from expected_state.rebuilds import RebuildLog
from reconcile.cli.config import PipelineConfig, SinkTableConfig
from reconcile.cli.config_run import provides
from reconcile.core.contract import ConfigurationError
from reconcile.core.metrics import Metrics
from reconcile.core.sink import TwoPhaseSink
from reconcile.engine.cycle import CommitCycle
from reconcile.engine.expected import ExpectedState
from sinks import registry
from sinks.base import TABLE_SINK

__all__ = ["check_writable", "cycle_builder", "run_logic", "split_table", "table_sink_of"]

log = logging.getLogger("reconcile.run")


def split_table(table: str) -> tuple[str | None, str]:
    """``schema.name`` -> (schema, name); ``name`` -> (None, name)."""
    schema, dot, name = table.partition(".")
    return (schema, name) if dot else (None, table)


def check_writable(pipeline: PipelineConfig, file: object = None) -> None:
    """Refuse a sink table that ``reconcile run`` has no writing sink for.

    Raises:
        ConfigurationError: a sink whose backend ``reconcile run`` cannot
            write (only PostgreSQL's provides it: the Spark staging and the
            lease need it); the message names the config ``file`` (when
            given), the pipeline, the sink and its key.
    """
    for sink in pipeline.sinks:
        if not provides(sink.connection, TABLE_SINK):
            raise ConfigurationError(
                ("" if file is None else f"{file}: ")
                + f"pipelines.{pipeline.name}.sinks.{sink.name}.{sink.connection.kind}: "
                f"{sink.connection}: reconcile run writes Postgres sinks only (a libpq dsn, or "
                "a postgresql+driver:// url); verify and repair do read this one"
            )


def table_sink_of(sink: SinkTableConfig) -> TwoPhaseSink:
    """The writing sink of the table, from its backend, in its ``write_mode``, keyed by ``keys``."""
    dsn = sink.connection.get_secret_value()
    schema, table = split_table(sink.table)
    table_sink = registry.capability(dsn, TABLE_SINK)
    built: TwoPhaseSink = table_sink(
        dsn,
        table,
        mode=sink.write_mode,
        name=sink.name,
        schema=schema,
        key=list(sink.keys),
    )
    return built


def cycle_builder(
    pipeline: PipelineConfig, *, metrics: Metrics | None = None, file: object = None
) -> Callable[[], CommitCycle]:
    """A ``build()`` for ``write_stream`` and ``HaNode``: a new cycle over new sink clients.

    The cycle's expected state is the pipeline's store, every sink keyed by
    its ``keys``; its epochs table is the progress log (shared by every
    instance that runs the pipeline). Its logic version is the run table's
    (``RunSettings.logic``), or the one a rebuild carried to it
    (:func:`run_logic`): a pipeline rebuilt to another logic refuses it.
    """
    check_writable(pipeline, file)

    def build() -> CommitCycle:
        # Read at each build: a rebuild may switch the logic while a standby waits.
        logic = run_logic(pipeline)
        keys = {sink.name: list(sink.keys) for sink in pipeline.sinks}
        expected = ExpectedState(
            pipeline.store,
            pipeline.name,
            keys,
            retention_hours=pipeline.store_retention_hours,
            safety_margin_minutes=pipeline.store_safety_margin_minutes,
        )
        sinks = [table_sink_of(sink) for sink in pipeline.sinks]
        return CommitCycle(pipeline.name, sinks, expected_state=expected, metrics=metrics,
                           logic_version=logic)  # fmt: skip

    return build


def run_logic(pipeline: PipelineConfig) -> str | None:
    """The logic version a run of ``pipeline``'s run table writes as.

    The run table's (``logic_version``, else ``app``), except after a rebuild
    that switched the pipeline to the run table's very app: the run then
    carries the rebuild's logic version, whatever ``--logic-version`` named
    it, so that pointing ``app`` at the rebuilt app is all a user changes.
    Not when the run table names a logic version of its own other than the
    one the rebuild replaced (a third logic: refused at start, as any other).
    """
    run = pipeline.run
    if run is None:
        return None
    newest = RebuildLog(pipeline.store, pipeline.name).newest()
    if newest is None or newest.step != "switched" or run.logic == newest.logic_version:
        return run.logic
    stale = not run.logic_version or run.logic_version == newest.previous
    if newest.detail.get("app") != run.app or not stale:
        return run.logic
    log.info("pipeline %s: app %s is the app %s switched to: running as logic %r (the run "
             "table's logic_version, %r, was the logic before it)", pipeline.name, run.app,
             newest.describe(), newest.logic_version, run.logic_version or None)  # fmt: skip
    return newest.logic_version
