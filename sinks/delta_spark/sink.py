"""Delta Lake two-phase-commit sink through delta-spark: prepare stages Parquet, commit runs Spark.

It shares its body with the delta-rs sink (``sinks.delta``): the names of
manifests and staged files and their checks (``sinks.delta.manifest``), the
prepared area (``sinks.delta.prepared``), the tokens in the log, the fence by
generation and the txn-id reading (``sinks.delta.tokens``), the rows' schema
(``sinks.delta.rows``). Only the commit differs: a Spark command carrying
Delta's own transaction identifier (``sinks.delta_spark.apply``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.delta_commit import DataFile, write_data_file
from reconcile.core import hooks
from reconcile.core.contract import (
    OK,
    Change,
    ConfigurationError,
    Fatal,
    FencedError,
    InvalidInputError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
    WriterIdentity,
    validate_name,
)
from reconcile.core.sink import SinkCapabilities
from sinks.base import local_path, split_options
from sinks.changes import net_changes
from sinks.delta.manifest import commit_metadata, refuse_bad_manifest
from sinks.delta.manifest import data_file_name as _data_file_name
from sinks.delta.prepared import PreparedArea
from sinks.delta.recovery import DeltaRecoveryTarget
from sinks.delta.rows import rows_to_arrow, state_schema
from sinks.delta.steps import Owner, abort_epoch, epoch_in_log, ready_to_commit, stranded
from sinks.delta.tokens import (
    claim_generation,
    epoch_app_id,
    fence_refusal,
    open_table,
)
from sinks.delta_spark.apply import DELETE_COLUMN, apply_epoch
from sinks.ownership import WriterBinding, foreign_prepare

__all__ = ["COMMIT_CHECKED", "DeltaSparkSink", "open_uri"]

# Between commit()'s reading of the log (token, fence) and its Spark command.
COMMIT_CHECKED = hooks.declare("delta_spark_sink.commit.checked")


class DeltaSparkSink:
    """A TwoPhaseSink writing the Delta table ``<root>/<name>`` through delta-spark.

    - ``stage`` buffers rows (dicts, Arrow tables, or ``Change`` upserts and
      deletes when a key is given) in memory, netted by key (the last change wins);
    - ``prepare`` records the writer's generation in the log (the fence), then
      writes one fsynced Parquet file of the epoch's rows (a flag column marks
      deletes) under ``_txn_files/<key>/`` and, atomically, its manifest;
    - ``commit`` runs ONE Spark command on it, carrying Delta's transaction
      identifier (``<pipeline>/<sink>``, epoch): a MERGE by key, or an append
      without one; then drops the manifest and the staged file;
    - ``abort`` drops the manifest and the staged file;
    - ``recover`` lists the manifests whose epoch the log does not record.

    Whether an epoch committed is read from the table's own log (the
    SetTransaction of ``<pipeline>/<sink>``, and for an older epoch its
    commit's userMetadata), never from the sink's files.
    """

    capabilities = SinkCapabilities(durable_prepare=True, epoch_column=True, pullable=True)

    def __init__(
        self,
        name: str,
        root: str | os.PathLike[str],
        *,
        key: Sequence[str] = (),
        schema: pa.Schema | None = None,
        spark: Any = None,
    ) -> None:
        """Build a sink client on the table ``<root>/<name>``.

        Args:
            name: the sink name ([A-Za-z0-9_]).
            root: the directory holding the sink's table (local filesystem).
            key: the key columns (MERGE by them); empty: every epoch is appended.
            schema: the row schema without ``_epoch``; default: the table's, or inferred.
            spark: the SparkSession (with Delta); default: the active one, at first use.
        """
        self._name = validate_name("sink", name)
        self.directory = Path(root) / name
        self.uri = str(self.directory)
        self.key = tuple(key)
        self._schema = schema
        self._spark = spark
        self._staged: dict[tuple[str, str, int], list[Any]] = {}
        self._binding = WriterBinding(f"Delta sink {self._name!r}")
        self._area = PreparedArea(self.directory)

    @property
    def name(self) -> str:
        """The sink's name."""
        return self._name

    def bind(self, writer: WriterIdentity) -> None:
        """Serve ``writer`` (idempotent); see :class:`sinks.ownership.WriterBinding`."""
        self._binding.bind(writer)

    @property
    def pipeline(self) -> str | None:
        """The pipeline of the writer it is bound to; None while unbound."""
        writer = self._binding.writer
        return None if writer is None else writer.pipeline

    def recovery_target(
        self, pipeline: str, generation: int | None, *, write: bool
    ) -> DeltaRecoveryTarget:
        """The table as a pull-and-diff target: read and repaired by delta-rs (see there)."""
        return DeltaRecoveryTarget(self.uri, self._name, pipeline, generation, key=self.key,
                                   log_id=self._binding.log_id, write=write)  # fmt: skip

    def close(self) -> None:
        """Nothing to close: the SparkSession is the caller's."""

    def session(self) -> Any:
        """The SparkSession the commits run on.

        Raises:
            ConfigurationError: none was given and none is active.
        """
        if self._spark is None:
            from pyspark.sql import SparkSession

            self._spark = SparkSession.getActiveSession()
            if self._spark is None:
                raise ConfigurationError(
                    f"Delta sink {self._name!r} ({self.uri}): delta+spark:// writes through a "
                    "SparkSession with Delta's SQL extension, and none is active; start one "
                    "first (or use delta:///, which needs no JVM)"
                )
        return self._spark

    # ------------------------------------------------------------------ contract

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        """Buffer ``rows`` for ``txn_id`` in memory (replacing an earlier staging)."""
        batch = [rows] if isinstance(rows, pa.Table) else list(rows)
        for i, row in enumerate(batch):
            if isinstance(row, Change) and row.op == "delete" and not self.key:
                return Fatal(
                    f"sink {self._name!r}, {txn_id}: row {i} is a delete, and the sink has no "
                    "key to delete by (delta+spark:///path?key=...); nothing was staged"
                )
            if not isinstance(row, dict | Change | pa.Table):
                return Fatal(
                    f"sink {self._name!r}, {txn_id}: row {i} is {type(row).__name__}, not a "
                    "dict, a Change or an Arrow table; nothing was staged"
                )
        self._staged[txn_id.key] = batch
        return OK

    @refuse_bad_manifest
    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Fence, then write the staged rows as fsynced Parquet plus a manifest; invisible."""
        table = open_table(self.uri)
        fenced = fence_refusal(table, txn_id, sink=self._name)
        if fenced is not None:
            return fenced
        done = epoch_in_log(table, txn_id, "prepare", **self._owner())
        if done is not None:
            self._staged.pop(txn_id.key, None)
            return done  # OK: this epoch is already in the table
        rows = self._staged.get(txn_id.key)
        if rows is None:
            if self._area.read(txn_id) is not None:
                return OK  # prepared before (perhaps by a process that died)
            return Retryable(f"sink {self._name!r}, {txn_id}: nothing staged in this process")
        try:
            data = self._staged_table(rows, txn_id, table)
            # The claim also creates the table (from the rows' schema), so that
            # every commit is a command on an existing table, and every one
            # after the claim is fenced by it.
            claim_generation(self.uri, table, txn_id, data.drop_columns([DELETE_COLUMN]).schema,
                             restate_epoch=True)  # fmt: skip
        except FencedError as exc:
            return Fatal.of(exc)
        except InvalidInputError as exc:
            return Fatal(f"sink {self._name!r}, {txn_id}: {exc}", exc)
        except RetryableError as exc:
            # WHY: a lost claim race may mean a newer writer claimed: say so.
            fenced = fence_refusal(open_table(self.uri), txn_id, sink=self._name)
            return fenced if fenced is not None else Retryable.of(exc)
        if self._area.newer_holder(txn_id):
            return Fatal(f"sink {self._name!r}, {txn_id}: fenced, a newer writer prepared it")
        files: list[DataFile] = []
        try:
            if data.num_rows:
                rel = _data_file_name(txn_id, uuid.uuid4().hex)
                files.append(write_data_file(self.uri, rel, data))
            self._area.write(txn_id, files, self._binding.log_id)
        except OSError as exc:
            return Retryable(f"sink {self._name!r}, {txn_id}: prepare failed: {exc}")
        # Re-prepare replaces the content: drop the files of the previous manifest.
        self._area.drop_files(txn_id, keep=frozenset(f.path for f in files))
        del self._staged[txn_id.key]
        return OK

    @refuse_bad_manifest
    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Apply the prepared file in ONE Spark command carrying Delta's txn id."""
        table = open_table(self.uri)
        early = ready_to_commit(table, txn_id, settle=self._tidy, **self._owner())
        if early is not None:
            return early
        # WHY: a zombie (older generation) must not write once a newer one has
        # claimed the table; the claim restated the epoch token, so a command
        # that read the log before the claim conflicts with it (Retryable, and
        # the retry lands here and is fenced).
        fenced = fence_refusal(table, txn_id, sink=self._name)
        if fenced is not None:
            return fenced
        manifest = self._area.read(txn_id)
        if manifest is None:
            return Fatal(f"sink {self._name!r}, {txn_id}: commit of a txn that was never prepared")
        if manifest.get("log_id") != self._binding.log_id:
            return foreign_prepare(
                f"Delta sink {self._name!r}",
                txn_id,
                found_log=manifest.get("log_id"),
                log_id=self._binding.log_id,
                location=str(self._area.manifest_path(txn_id)),
            )
        paths = [self.directory / f["path"] for f in manifest["files"]]
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            return Fatal(
                f"sink {self._name!r}, {txn_id}: prepared file {missing[0]!r} is missing; "
                "nothing was written"
            )
        schema = state_schema(table)
        if schema is None and paths:
            # WHY: prepare's claim created the table before it wrote rows; a
            # table gone since would turn this commit into a silent loss.
            return Fatal(
                f"sink {self._name!r}, {txn_id}: the Delta table {self.uri!r} is gone, and "
                "the epoch's rows are prepared; nothing was written"
            )
        if schema is None:
            # An empty epoch before the table exists (prepare made no claim):
            # there is nothing to make visible and no schema; done.
            self._tidy(txn_id)
            return OK
        hooks.point(COMMIT_CHECKED)
        metadata = {
            **commit_metadata(txn_id, self._binding.log_id),
            "reconcile.app_id": epoch_app_id(txn_id),
            "reconcile.version": txn_id.epoch,
        }
        try:
            apply_epoch(
                self.session(),
                self.uri,
                [str(p) for p in paths],
                app_id=epoch_app_id(txn_id),
                epoch=txn_id.epoch,
                columns=schema.names,
                key=self.key,
                metadata=metadata,
            )
        except InvalidInputError as exc:
            return Fatal(f"sink {self._name!r}, {txn_id}: {exc}", exc)
        except RetryableError as exc:
            return Retryable.of(exc)
        # Any other exception propagates: its outcome is unknown, and the next
        # commit() resolves it from the log's token.
        self._tidy(txn_id)
        return OK

    @refuse_bad_manifest
    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Delete the staged rows, the manifest and the staged file of ``txn_id``."""
        self._staged.pop(txn_id.key, None)
        return abort_epoch(self._area, self.uri, txn_id, sink=self._name, settle=self._tidy)

    def recover(self) -> Sequence[SinkTxnId]:
        """Txns prepared (manifest or leftover files) whose epoch the log does not record."""
        return stranded(self._area, self.uri, settle=self._tidy)

    # ----------------------------------------------------------------- internals

    def _staged_table(self, rows: list[Any], txn_id: SinkTxnId, table: Any) -> pa.Table:
        """The epoch's rows netted by key, plus ``_epoch`` and the delete flag."""
        if self.key:
            upserts, deletes = net_changes(rows, self.key, f"Delta table {self.uri!r}")
        else:
            upserts = []
            for item in rows:  # dicts, upsert Changes, Arrow tables (the writer on Spark's)
                if isinstance(item, pa.Table):
                    upserts.extend(item.to_pylist())
                else:
                    upserts.append(dict(item.row) if isinstance(item, Change) else item)
            deletes = []
        data = rows_to_arrow(upserts + deletes, txn_id.epoch, stored=state_schema(table),
                             declared=self._schema, uri=self.uri)  # fmt: skip
        flags = [False] * len(upserts) + [True] * len(deletes)
        return data.append_column(DELETE_COLUMN, pa.array(flags, pa.bool_()))

    def _tidy(self, txn_id: SinkTxnId) -> None:
        """Drop a committed (or aborted) epoch's manifest, then its staged file."""
        self._area.remove(txn_id)
        self._area.drop_files(txn_id)

    def _owner(self) -> Owner:
        """Who commits, for the shared steps (sinks/delta/steps.py): name, table, writer."""
        return {"sink": self._name, "uri": self.uri, "binding": self._binding}


def open_uri(name: str, uri: str) -> DeltaSparkSink:
    """The sink of ``delta+spark:///path[?key=k1,k2]``: its table at ``<path>/<name>``.

    Raises:
        ConfigurationError: the URI names a remote host.
    """
    base, options = split_options(uri, ("key",))
    key = [k.strip() for k in options.get("key", "").split(",") if k.strip()]
    return DeltaSparkSink(name, local_path(name, base), key=key)
