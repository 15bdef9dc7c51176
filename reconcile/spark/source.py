"""``df.writeStream.format("reconcile")``: the exactly-once writer as a Spark Python data source.

Spark 4's Python streaming writer is two-phase by design, and maps onto the
commit cycle directly:

- ``write`` runs in each executor task: it stages the task's Arrow batches as
  one file under the ``staging`` option and returns its path and row count
  (the commit message);
- ``commit(messages, batchId)`` runs on the driver side once every task has
  succeeded: it commits the named files as epoch ``batchId`` through the
  commit cycle (expected state recorded, decision, one transaction per sink),
  then removes them;
- ``abort(messages, batchId)`` removes the files; nothing was recorded.

Spark calls ``commit`` in a Python process of its own, not in the process
that started the query, so the cycle cannot be handed over as an object: the
``build`` option names an importable function, ``"package.module:function"``,
called with the writer's options (a dict of strings) and returning the
pipeline's ``CommitCycle``. Each commit builds and starts a fresh cycle (a
new writer generation, which fences the previous one): what was in doubt from
an earlier batch is settled first, as after any restart. Register once per
session with :func:`register`.

One DataFrame, one sink: the cycle's sink named by the ``sink`` option (or
its only sink) gets the rows. For several sink tables from one stream, use
``reconcile.spark.write_stream`` with ``outputs=``.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from reconcile.core.contract import ConfigurationError
from reconcile.engine.cycle import CommitCycle
from reconcile.engine.driver import Driver
from reconcile.spark.outputs import outputs_of
from reconcile.spark.staging import read_staged, stage_batches

__all__ = ["ReconcileDataSource", "StagedFile", "load_builder", "register"]

FORMAT = "reconcile"


def load_builder(spec: str) -> Any:
    """The function ``"package.module:function"`` names.

    Raises:
        ConfigurationError: the spec is malformed, or names nothing importable.
    """
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise ConfigurationError(
            f"option build={spec!r}: expected 'package.module:function' (a function that "
            "takes the writer's options and returns a CommitCycle)"
        )
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"option build={spec!r}: cannot import it: {exc}") from exc
    if not callable(found):
        raise ConfigurationError(f"option build={spec!r} is a {type(found).__name__}, not callable")
    return found


@dataclass
class StagedFile(WriterCommitMessage):
    """One task's staged rows: the file (None when the task had no rows) and its row count."""

    path: str | None
    rows: int


class _Writer(DataSourceStreamArrowWriter):
    def __init__(self, options: Mapping[str, str], schema: Any) -> None:
        self.options = dict(options)
        self.schema = schema
        for required in ("build", "staging"):
            if not self.options.get(required):
                raise ConfigurationError(
                    f"format({FORMAT!r}) needs .option({required!r}, ...): "
                    + (
                        "'package.module:function' returning the pipeline's CommitCycle"
                        if required == "build"
                        else "a folder the driver and every executor see"
                    )
                )
        self.folder = os.path.join(os.path.abspath(self.options["staging"]), "format")

    def write(self, iterator: Iterator[Any]) -> StagedFile:
        staged = stage_batches(self.folder, iterator)
        return StagedFile(None, 0) if staged is None else StagedFile(*staged)

    def _files(self, messages: list[WriterCommitMessage | None]) -> list[StagedFile]:
        return [m for m in messages if isinstance(m, StagedFile)]

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        files = self._files(messages)
        build = load_builder(self.options["build"])
        driver = Driver(lambda: _checked(build(self.options)))
        try:
            cycle = driver.current()
            sink = self._sink(cycle)
            table = read_staged(
                [f.path for f in files if f.path],
                sum(f.rows for f in files),
                to_arrow_schema(self.schema, timezone=self.options.get("timezone", "UTC")),
                batch_id=batchId,
                sink=sink,
            )
            driver.run(batchId, outputs_of(cycle.pipeline, batchId, {sink: table}))
        finally:
            driver.close()
            self._remove()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._remove()

    def _sink(self, cycle: CommitCycle) -> str:
        name = self.options.get("sink")
        if name is None:
            if len(cycle.sinks) != 1:
                raise ConfigurationError(
                    f"pipeline {cycle.pipeline!r} has sinks {sorted(cycle.sinks)}: name the one "
                    "this stream writes with .option('sink', ...), or use write_stream(outputs=) "
                    "for several"
                )
            return next(iter(cycle.sinks))
        if name not in cycle.sinks:
            raise ConfigurationError(
                f"option sink={name!r}: pipeline {cycle.pipeline!r} has sinks {sorted(cycle.sinks)}"
            )
        return name

    def _remove(self) -> None:
        """Everything staged here: this batch's files and any dead attempt's.

        Micro-batches run one after another, and a batch's commit or abort runs
        after all its tasks: any file here is this batch's (read by now) or a
        dead attempt's (of this batch, or of a batch whose driver died), read
        by no one. The folder is the query's own (one ``staging`` option per query).
        """
        shutil.rmtree(self.folder, ignore_errors=True)


def _checked(cycle: Any) -> CommitCycle:
    if not isinstance(cycle, CommitCycle):
        raise ConfigurationError(
            f"the build function returned a {type(cycle).__name__}, not a CommitCycle"
        )
    return cycle


class ReconcileDataSource(DataSource):
    """The ``reconcile`` streaming sink (write only)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def streamWriter(self, schema: Any, overwrite: bool) -> _Writer:
        return _Writer(self.options, schema)


def register(spark: Any) -> None:
    """Make ``format("reconcile")`` available in ``spark``'s session."""
    spark.dataSource.register(ReconcileDataSource)
