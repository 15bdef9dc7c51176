"""Delta Lake two-phase-commit sink: prepare writes Parquet, commit adds it in one Delta commit."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]

from expected_state.delta_commit import (
    BasedOn,
    DataFile,
    DeltaCommit,
    commit_files,
    write_data_file,
)
from reconcile.core import hooks
from reconcile.core.contract import (
    OK,
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
from sinks.base import local_path
from sinks.delta.manifest import FILES_DIR as _FILES
from sinks.delta.manifest import (
    commit_metadata,
    refuse_bad_manifest,
)
from sinks.delta.manifest import key_name as _key_name
from sinks.delta.prepared import PreparedArea
from sinks.delta.recovery import DeltaRecoveryTarget
from sinks.delta.rows import EPOCH_COLUMN, rows_to_arrow, state_schema
from sinks.delta.steps import Owner, abort_epoch, epoch_in_log, ready_to_commit, stranded
from sinks.delta.tokens import (
    claim_generation,
    epoch_app_id,
    fence_id,
    fence_refusal,
    open_table,
)
from sinks.ownership import WriterBinding, foreign_prepare

__all__ = ["COMMIT_CHECKED", "EPOCH_COLUMN", "DeltaSink", "open_uri"]

# Between commit()'s reading of the table (token, order) and its Delta commit.
COMMIT_CHECKED = hooks.declare("delta_sink.commit.checked")

# sinks/delta/manifest.py owns how manifests and prepared data files are named
# and the checks every manifest passes before a path in it is deleted or
# committed; sinks/delta/prepared.py (PreparedArea, shared with the delta-spark
# sink) reads, writes and drops them.


class DeltaSink:
    """A TwoPhaseSink writing a Delta table at ``<root>/<name>`` through delta-rs.

    - ``stage`` buffers rows in memory (dicts; ``_epoch`` is added);
    - ``prepare`` writes and fsyncs one Parquet file under ``_txn_files/<key>/``
      and then, atomically (write, fsync, rename), the manifest
      ``_prepared/<key>.json``: the manifest's presence is what "prepared" means;
    - ``commit`` adds the manifest's files in ONE Delta commit carrying
      ``Transaction("<pipeline>/<sink>", epoch)`` and the writer's generation
      token, then deletes the manifest;
    - ``abort`` deletes the manifest, then the files;
    - ``recover`` lists manifests (and orphan file directories) of epochs that
      no commit references.

    The table is append-only: a replayed epoch is recognised by its token and
    never added twice.

    ``bind(writer)`` records the writer's progress log id in each manifest and
    in each commit's metadata (``reconcile.log_id``); an epoch whose commit
    was made for another log (or by an unbound sink) is a Fatal
    MarkerMismatchError, never OK. Unbound, the sink is its own writer and
    records no log id. Every manifest is checked before it is used
    (sinks/delta/manifest.py): only the sink's own files inside the table
    root are ever deleted or committed.
    """

    capabilities = SinkCapabilities(durable_prepare=True, epoch_column=True, pullable=True)

    def __init__(
        self, name: str, root: str | os.PathLike[str], *, schema: pa.Schema | None = None
    ) -> None:
        """Build a sink client on the table ``<root>/<name>``.

        Args:
            name: the sink name ([A-Za-z0-9_]).
            root: the directory holding the sink's table (local filesystem).
            schema: the row schema without ``_epoch``; default: the table's, or
                inferred from the first staged rows.
        """
        self._name = validate_name("sink", name)
        self.directory = Path(root) / name
        self.uri = str(self.directory)
        self._schema = schema
        self._staged: dict[tuple[str, str, int], list[Any]] = {}
        self._binding = WriterBinding(f"Delta sink {self._name!r}")
        self._area = PreparedArea(self.directory)

    @property
    def name(self) -> str:
        """The sink's name."""
        return self._name

    @property
    def pipeline(self) -> str | None:
        """The pipeline of the writer it is bound to; None while unbound."""
        writer = self._binding.writer
        return None if writer is None else writer.pipeline

    def recovery_target(
        self, pipeline: str, generation: int | None, *, write: bool
    ) -> DeltaRecoveryTarget:
        """The table as a pull-and-diff target (``sinks.delta.recovery``), as ``generation``."""
        return DeltaRecoveryTarget(self.uri, self._name, pipeline, generation, key=(),
                                   log_id=self._binding.log_id, write=write)  # fmt: skip

    def close(self) -> None:
        """Nothing to close: each call opens the table's log afresh."""

    def arrow_schema(self) -> pa.Schema | None:
        """The rows' types (``schema=``, else the table's) without ``_epoch``; None before both."""
        schema = self._schema or state_schema(open_table(self.uri))
        return None if schema is None else pa.schema([f for f in schema if f.name != EPOCH_COLUMN])

    def bind(self, writer: WriterIdentity) -> None:
        """Serve ``writer`` (idempotent); see :class:`sinks.ownership.WriterBinding`."""
        self._binding.bind(writer)

    # ------------------------------------------------------------------ contract

    def stage(self, txn_id: SinkTxnId, rows: Iterable[Any]) -> SinkOutcome:
        """Buffer ``rows`` for ``txn_id`` in memory (replacing an earlier staging)."""
        batch = list(rows)
        for i, row in enumerate(batch):
            if not isinstance(row, dict):
                return Fatal(
                    f"sink {self._name!r}, {txn_id}: row {i} is {type(row).__name__}, not a "
                    "dict; nothing was staged"
                )
        self._staged[txn_id.key] = batch
        return OK

    @refuse_bad_manifest
    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Write the staged rows as fsynced Parquet plus a manifest; invisible until commit."""
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
            if self._read_manifest(txn_id) is not None:
                return OK  # prepared before (perhaps by a process that died)
            return Retryable(f"sink {self._name!r}, {txn_id}: nothing staged in this process")
        try:
            data = rows_to_arrow(
                rows, txn_id.epoch, stored=state_schema(table), declared=self._schema, uri=self.uri
            )
        except InvalidInputError as exc:
            return Fatal(f"sink {self._name!r}, {txn_id}: {exc}", exc)
        try:
            claim_generation(self.uri, table, txn_id, data.schema)
        except FencedError as exc:
            return Fatal.of(exc)
        except RetryableError as exc:
            fenced = fence_refusal(open_table(self.uri), txn_id, sink=self._name)
            return fenced if fenced is not None else Retryable.of(exc)
        old = self._read_manifest(txn_id)
        if old is not None and SinkTxnId.from_string(old["txn"]).generation > txn_id.generation:
            return Fatal(f"sink {self._name!r}, {txn_id}: fenced, a newer writer prepared it")
        key = _key_name(txn_id)
        files: list[DataFile] = []
        try:
            if data.num_rows:
                rel = f"{_FILES}/{key}/part-g{txn_id.generation}-{uuid.uuid4().hex}.parquet"
                files.append(write_data_file(self.uri, rel, data))
            self._write_manifest(txn_id, files)
        except OSError as exc:
            return Retryable(f"sink {self._name!r}, {txn_id}: prepare failed: {exc}")
        # Re-prepare replaces the content: drop the files of the previous manifest.
        self._area.drop_files(txn_id, keep=frozenset(f.path for f in files))
        del self._staged[txn_id.key]
        return OK

    @refuse_bad_manifest
    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Add the prepared files in ONE Delta commit, tagged with the txn's epoch."""
        table = open_table(self.uri)
        # (The epoch's data files live under _txn_files/ and are the table's: its
        # settle drops the manifest only.)
        early = ready_to_commit(table, txn_id, settle=self._area.remove, **self._owner())
        if early is not None:
            return early
        manifest = self._read_manifest(txn_id)
        if manifest is None:
            # A zombie's txn was discarded by the taker.
            fenced = fence_refusal(table, txn_id, sink=self._name)
            if fenced is not None:  # (a Fatal is falsy: never `fenced or ...`)
                return fenced
            return Fatal(f"sink {self._name!r}, {txn_id}: commit of a txn that was never prepared")
        files = [DataFile(**{**f, "partition_values": {}}) for f in manifest["files"]]
        for f in files:
            if not (self.directory / f.path).exists():
                return Fatal(
                    f"sink {self._name!r}, {txn_id}: prepared file {f.path!r} is missing; "
                    "nothing was written"
                )
        if manifest.get("log_id") != self._binding.log_id:
            return foreign_prepare(
                f"Delta sink {self._name!r}",
                txn_id,
                found_log=manifest.get("log_id"),
                log_id=self._binding.log_id,
                location=str(self._manifest_path(txn_id)),
            )
        # The schema comes from the prepared file itself; commit_files then checks
        # it against the table's, naming any column that does not match.
        schema = pq.read_schema(self.directory / files[0].path) if files else None
        schema = schema or state_schema(table)
        if schema is None:
            # An empty epoch before the table exists: there is nothing to make
            # visible, and no schema to create the table with; done.
            self._area.remove(txn_id)
            return OK
        hooks.point(COMMIT_CHECKED)
        try:
            # The fence is checked on `table`, the snapshot whose token said the
            # epoch is not in yet, and the commit is based on that same snapshot
            # and carries the fence: a takeover that commits after it conflicts,
            # so a zombie can neither write after it nor lower the fence.
            commit = DeltaCommit(
                table_uri=self.uri,
                schema=schema,
                app_id=epoch_app_id(txn_id),
                version=txn_id.epoch,
                add=files,
                fence=(fence_id(txn_id), txn_id.generation),
                custom_metadata=commit_metadata(txn_id, self._binding.log_id),
            )
            commit_files(commit, None if table is None else BasedOn(table))
        except FencedError as exc:
            return Fatal.of(exc)
        except InvalidInputError as exc:
            return Fatal(f"sink {self._name!r}, {txn_id}: {exc}", exc)
        except RetryableError as exc:
            return Retryable.of(exc)
        # OutcomeUnknownError propagates: the contract says an escaping exception
        # means "outcome unknown", and the next commit() resolves it by the token.
        self._area.remove(txn_id)
        return OK

    @refuse_bad_manifest
    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Delete the staged rows, the manifest and the prepared files of ``txn_id``."""
        self._staged.pop(txn_id.key, None)
        return abort_epoch(self._area, self.uri, txn_id, sink=self._name, settle=self._area.remove)

    def recover(self) -> Sequence[SinkTxnId]:
        """Txns prepared (manifest or leftover files) whose epoch no commit references."""
        return stranded(self._area, self.uri, settle=self._area.remove)

    # ----------------------------------------------------------------- internals

    def _manifest_path(self, txn_id: SinkTxnId) -> Path:
        return self._area.manifest_path(txn_id)

    def _read_manifest(self, txn_id: SinkTxnId) -> dict[str, Any] | None:
        """The checked manifest of ``txn_id``'s epoch (see PreparedArea.read)."""
        return self._area.read(txn_id)

    def _write_manifest(self, txn_id: SinkTxnId, files: list[DataFile]) -> None:
        self._area.write(txn_id, files, self._binding.log_id)

    def _owner(self) -> Owner:
        """Who commits, for the shared steps (sinks/delta/steps.py): name, table, writer."""
        return {"sink": self._name, "uri": self.uri, "binding": self._binding}


def open_uri(name: str, uri: str) -> DeltaSink:
    """The sink of ``delta:///path``: its table at ``<path>/<name>``.

    Raises:
        ConfigurationError: the URI names a remote host.
    """
    return DeltaSink(name, local_path(name, uri))
