"""A prepared epoch of the Iceberg sink: its intent file, and its record in the table's properties.

``prepare`` writes the epoch's changes (upserts and deletes by key) as one
Parquet file, the *intent*, under ``<table location>/reconcile/``, through the
table's own FileIO (local disk, S3, ...), and then records it in the table
property ``reconcile.<pipeline>.<sink>.prepared.<epoch>``: a JSON object with
the txn id, the intent's path and the progress log id. The record's presence
is what "prepared" means; it lives in the catalog, so any process that loads
the table finds it (``recover``), and the commit that makes the epoch visible
removes it in the same metadata change.

A record is checked before its path is read or deleted: the path must be the
one this sink writes for that txn, under the table's location:
``reconcile/<pipeline>-<sink>-<epoch>-g<generation>-<32 hex>.parquet``. A
record that fails the check (edited by hand, written by another program)
stops the operation with a Fatal naming it, and nothing is read, deleted or
committed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]
from pyiceberg.table import Table

from reconcile.core.contract import (
    Fatal,
    FatalError,
    ObjectTooLargeError,
    SinkOutcome,
    SinkTxnId,
    TxnIdParseError,
)
from sinks.iceberg.tokens import BadPropertyError, SinkKeys

__all__ = [
    "INTENT_DIR",
    "OP_COLUMN",
    "BadRecordError",
    "PreparedRecord",
    "delete_intent",
    "prepared_records",
    "read_intent",
    "read_record",
    "record_body",
    "refuse_bad_record",
    "write_intent",
]

INTENT_DIR = "reconcile"
# In an intent file: 0 for an upsert (the whole row), 1 for a delete (its key).
OP_COLUMN = "_reconcile_op"
UPSERT, DELETE = 0, 1


class BadRecordError(FatalError):
    """A prepared record the sink did not write as it is: garbage, or a path not its own."""


_Sink = TypeVar("_Sink")


def refuse_bad_record(
    operation: Callable[[_Sink, SinkTxnId], SinkOutcome],
) -> Callable[[_Sink, SinkTxnId], SinkOutcome]:
    """A record or property that fails its checks becomes a Fatal naming it; nothing is touched.

    A retry would read the same garbage again: the operation stops, naming
    the table, the property and the value (or the metadata file too large to
    read, ``sinks.iceberg.bounded_io``).
    """

    @functools.wraps(operation)
    def checked(sink: _Sink, txn_id: SinkTxnId) -> SinkOutcome:
        try:
            return operation(sink, txn_id)
        except (BadRecordError, BadPropertyError, ObjectTooLargeError) as exc:
            return Fatal.of(exc)

    return checked


@dataclass(frozen=True)
class PreparedRecord:
    """A checked prepared record: its txn, its intent file (None: no change), its log id."""

    txn: SinkTxnId
    intent: str | None
    log_id: str | None


def _key_name(txn_id: SinkTxnId) -> str:
    return f"{txn_id.pipeline}-{txn_id.sink}-{txn_id.epoch}"


def _intent_folder(table: Table) -> str:
    return f"{table.metadata.location.rstrip('/')}/{INTENT_DIR}/"


def record_body(txn_id: SinkTxnId, intent: str | None, log_id: str | None) -> str:
    """The property value of ``txn_id``'s prepared record."""
    return json.dumps({"txn": str(txn_id), "intent": intent, "log_id": log_id})


def _check(table: Table, name: str, value: str) -> PreparedRecord:
    where = f"table property {name!r} of Iceberg table {'.'.join(table.name())}"
    try:
        body = json.loads(value)
        txn = SinkTxnId.from_string(body["txn"])
        intent, log_id = body["intent"], body.get("log_id")
        if not (intent is None or isinstance(intent, str)):
            raise TypeError("intent must be a string or null")
        if not (log_id is None or isinstance(log_id, str)):
            raise TypeError("log_id must be a string or null")
    except (ValueError, KeyError, TypeError, TxnIdParseError) as exc:
        raise BadRecordError(
            f"{where} is not a prepared record this sink wrote ({exc}); nothing was read, "
            "deleted or committed. Remove the property once you know what wrote it.",
            property=name,
        ) from exc
    if not name.endswith(f".prepared.{txn.epoch}") or SinkKeys.of(txn).prepared(txn.epoch) != name:
        raise BadRecordError(
            f"{where} names txn {txn}, which is not of that property; nothing was read, "
            "deleted or committed",
            property=name,
        )
    if intent is not None:
        folder = _intent_folder(table)
        pattern = re.escape(f"{_key_name(txn)}-g{txn.generation}-") + "[0-9a-f]{32}\\.parquet"
        rest = intent[len(folder) :] if intent.startswith(folder) else ""
        if not re.fullmatch(pattern, rest):
            raise BadRecordError(
                f"{where} lists the file {intent!r:.300}, which is not one this sink wrote for "
                f"{txn} (expected {folder}{_key_name(txn)}-g{txn.generation}-<32 hex>.parquet); "
                "nothing was read, deleted or committed. Remove the property once you know "
                "what wrote it.",
                property=name,
                intent=intent[:300],
            )
    return PreparedRecord(txn, intent, log_id)


def read_record(table: Table, keys: SinkKeys, epoch: int) -> PreparedRecord | None:
    """The checked prepared record of ``epoch``; None if there is none.

    Raises:
        BadRecordError: the record is not one this sink wrote as it is.
    """
    name = keys.prepared(epoch)
    value = table.metadata.properties.get(name)
    return None if value is None else _check(table, name, value)


def prepared_records(table: Table, sink: str) -> list[PreparedRecord]:
    """Every checked prepared record of sink ``sink`` (of any pipeline) in the table.

    Raises:
        BadRecordError: a record is not one this sink wrote as it is.
    """
    found = []
    for name, value in sorted(table.metadata.properties.items()):
        parts = name.split(".")
        if len(parts) == 5 and parts[0] == "reconcile" and parts[2:4] == [sink, "prepared"]:
            found.append(_check(table, name, value))
    return found


def write_intent(table: Table, txn_id: SinkTxnId, changes: pa.Table) -> str:
    """Write ``changes`` (with ``OP_COLUMN``) as the txn's intent file; return its path.

    The name is new every time (a uuid): a prepare again writes a new file,
    and a crash midway leaves a file no record names.
    """
    name = f"{_key_name(txn_id)}-g{txn_id.generation}-{uuid.uuid4().hex}.parquet"
    path = f"{_intent_folder(table)}{name}"
    intent_file = table.io.new_output(path)
    with intent_file.create(overwrite=True) as stream:
        pq.write_table(changes, stream)
    return path


def read_intent(table: Table, record: PreparedRecord) -> pa.Table | None:
    """The changes of a checked record (None: the record names no file).

    Raises:
        FileNotFoundError: the intent file is gone (deleted by hand, or by an
            orphan-file clean-up that ran while the epoch was prepared).
    """
    if record.intent is None:
        return None
    with table.io.new_input(record.intent).open() as stream:
        return pq.read_table(stream)


def delete_intent(table: Table, record: PreparedRecord) -> None:
    """Delete a checked record's intent file, if it is still there (best effort)."""
    if record.intent is None:
        return
    # An orphan at worst if it fails: no record names it any more.
    with contextlib.suppress(FileNotFoundError, OSError):
        table.io.delete(record.intent)


def ops_of(changes: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(upserts, deletes) of an intent table, without the op column."""
    import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

    op = changes.column(OP_COLUMN)
    rest = changes.drop_columns([OP_COLUMN])
    return rest.filter(pc.equal(op, UPSERT)), rest.filter(pc.equal(op, DELETE))


def with_ops(upserts: pa.Table, deletes: pa.Table) -> pa.Table:
    """One intent table: the upserts, then the deletes (keys only, other columns null)."""
    ops: list[Any] = [UPSERT] * upserts.num_rows + [DELETE] * deletes.num_rows
    schema = pa.schema([f.with_nullable(True) for f in upserts.schema])
    filled = {
        name: deletes.column(name) if name in deletes.column_names else pa.nulls(deletes.num_rows)
        for name in schema.names
    }
    table = pa.concat_tables(
        [upserts.cast(schema), pa.table(filled).cast(schema)]
        if deletes.num_rows
        else [upserts.cast(schema)]
    )
    return table.append_column(OP_COLUMN, pa.array(ops, pa.int8()))
