"""A pull-and-diff repair of a Delta table as ONE fenced Delta commit (``sinks.delta.recovery``).

The files holding a key to upsert or delete are removed and replaced, file by
file (bounded memory), by their other rows; the expected rows go in one new
file; all of it in one commit carrying the epoch token at the target epoch
(the high-water mark, as the sink's own commit records it) and the
generation fence. The commit is based on the version the pull read and is
never rebased: a commit that landed since makes it fail, nothing written.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.delta_commit import (
    BasedOn,
    DataFile,
    DeltaCommit,
    check_fence,
    commit_files,
    write_data_file,
)
from reconcile.core.contract import InvalidInputError, RetryableError, SinkTxnId
from reconcile.core.target import Repair
from sinks.delta.manifest import LOG_ID_KEY, commit_metadata, reconcile_fields
from sinks.delta.rows import EPOCH_COLUMN, state_schema

if TYPE_CHECKING:
    from sinks.delta.recovery import DeltaRecoveryTarget

__all__ = ["apply_repair", "unwritable_feature"]

# Writer features delta-rs writes faithfully through an add/remove commit: a
# table with any other one (deletion vectors, column mapping, constraints,
# generated or identity columns, change data feed, ...) is refused by name.
_WRITABLE = frozenset({"appendOnly", "invariants", "timestampNtz"})
# The features implied by a legacy writer version (3 to 6), by version.
_LEGACY = {3: "checkConstraints", 4: "changeDataFeed", 5: "columnMapping", 6: "identityColumns"}


def unwritable_feature(table: DeltaTable) -> str | None:
    """The first protocol feature of ``table`` that a delta-rs repair cannot write; None: none."""
    protocol = table.protocol()
    writer = protocol.min_writer_version
    if writer > 7:
        return f"writer version {writer}"
    if writer < 7:
        return next((f for v, f in sorted(_LEGACY.items()) if v <= writer), None)
    return next((f for f in sorted(protocol.writer_features or ()) if f not in _WRITABLE), None)


def apply_repair(target: DeltaRecoveryTarget, table: DeltaTable, repair: Repair) -> int | None:
    """Write ``repair`` to ``table`` (the pulled version) in ONE commit; None: pull again."""
    name = target.uri
    feature = unwritable_feature(table)
    if feature is not None:
        raise InvalidInputError(
            f"Delta table {name}: its protocol has the feature {feature!r}, which the repair's "
            "writer (delta-rs) cannot write faithfully; nothing was written (repair it with "
            "Spark, or verify only)",
            table=name,
            value=feature,
        )
    if (table.metadata().configuration or {}).get("delta.appendOnly") == "true" and (
        repair.deletes.num_rows or repair.upserts.num_rows
    ):
        raise InvalidInputError(
            f"Delta table {name} is append-only (delta.appendOnly): a repair replaces "
            "rows, which it forbids; nothing was written",
            table=name,
        )
    fence_app = target.fence_app
    fence = table.transaction_version(fence_app)
    # A writer's repair runs as its own generation; an operator's as the one the
    # log records (it neither claims the table nor lowers the fence).
    generation = target.generation if target.generation is not None else (fence or 0)
    # Checked here, before any file is written, and again by commit_files on
    # the same version: a newer generation in it is a FencedError.
    check_fence(table, (fence_app, generation), table_name=name)
    newest = target.newest_epoch(table)
    if newest != repair.seen_newest:
        return None
    epoch = repair.target_epoch
    if newest is not None and epoch < newest:
        raise InvalidInputError(
            f"Delta sink {target.sink!r}: cannot repair to epoch {epoch}, older than the "
            f"sink's newest epoch ({newest}); nothing was written",
            table=name,
        )
    if not repair.upserts.num_rows and not repair.deletes.num_rows and newest == epoch:
        return 0
    schema = state_schema(table)
    assert schema is not None  # the pulled version exists
    keys = list(repair.deletes.column_names)
    rewrite_id = uuid.uuid4().hex
    removed, added = _replace_files(name, table, schema, keys, repair, rewrite_id)
    upserts = _in_table_types(repair.upserts, schema, epoch)
    if upserts.num_rows:
        added.append(write_data_file(name, _file_name(rewrite_id), upserts))
    txn = SinkTxnId(target.pipeline, target.sink, epoch, generation)
    # Whose epochs the repair stands for: the writer's that runs it, or for an
    # operator's repair, the newest commit's (a replay of the target epoch then
    # finds its own log's commit, as after a normal commit).
    owner = target.log_id if target.generation is not None else _newest_owner(table, target)
    metadata = commit_metadata(txn, owner)
    metadata.update({"reconcile.kind": "repair", "reconcile.repair-id": rewrite_id,
                     "reconcile.mode": repair.mode})  # fmt: skip
    metadata.update({f"reconcile.{k}": v for k, v in repair.counts.items()})
    commit = DeltaCommit(
        table_uri=name,
        schema=schema,
        app_id=target.app_id,
        version=epoch,  # the high-water mark, raised to the target epoch
        add=added,
        remove=removed,
        fence=(fence_app, txn.generation),
        custom_metadata=metadata,
        # Never rebased onto a commit that landed after the pulled version: the
        # diff was made on that version, and a rebase would undo what came after.
        max_retries=0,
    )
    landed = _landed(name, rewrite_id)
    try:
        commit_files(commit, BasedOn(table, landed=landed))
    except RetryableError:
        return None  # another commit came first: nothing was written; pull again
    return int(repair.upserts.num_rows + repair.deletes.num_rows)


def _landed(uri: str, rewrite_id: str) -> Any:
    """Whether the commit of repair ``rewrite_id`` is in the log (read afresh)."""

    def check() -> bool:
        # Never rebased, the commit can only be the one after its base: the
        # newest few commits hold it if it landed.
        history = DeltaTable(uri).history(20)
        return any(reconcile_fields(c).get("reconcile.repair-id") == rewrite_id for c in history)

    return check


def _newest_owner(table: DeltaTable, target: DeltaRecoveryTarget) -> str | None:
    """The log id of the newest commit of the sink's epochs in ``table``'s history.

    Both sinks (and a repair) record ``reconcile.app_id`` with their epoch
    token; the whole history is read (newest first) because claims and
    compactions in between carry none, and an operator's repair is rare.
    """
    for info in map(reconcile_fields, table.history()):
        if info.get("reconcile.app_id") == target.app_id:
            owner = info.get(LOG_ID_KEY)
            return None if owner is None else str(owner)
    return None


def _in_table_types(rows: pa.Table, schema: pa.Schema, epoch: int) -> pa.Table:
    """Expected rows in the table's types, ``_epoch`` = the target epoch."""
    columns = []
    for field in schema:
        if field.name == EPOCH_COLUMN:
            columns.append(pa.array([epoch] * rows.num_rows, field.type))
        elif field.name in rows.column_names:
            columns.append(rows.column(field.name).cast(field.type))
        else:
            columns.append(pa.nulls(rows.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _millis(value: Any) -> int:
    """An add action's modification time in milliseconds (deltalake gives int or datetime)."""
    return int(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)


def _file_name(rewrite_id: str) -> str:
    """A new data file of repair ``rewrite_id``, at the table root as Delta writers put theirs.

    Never under the prepared area (``_txn_files``), which the sinks list as
    their own prepared epochs.
    """
    return f"part-repair-{rewrite_id}-{uuid.uuid4().hex}.parquet"


def _replace_files(root: str, table: DeltaTable, schema: pa.Schema, keys: list[str], repair: Repair,
                   rewrite_id: str) -> tuple[list[DataFile], list[DataFile]]:  # fmt: skip
    """The files holding a repaired key (to remove), and each one's other rows (to add)."""
    typed = pa.schema([schema.field(k) for k in keys])
    touched = pa.concat_tables(
        [repair.deletes.select(keys).cast(typed), repair.upserts.select(keys).cast(typed)]
    )
    removed: list[DataFile] = []
    added: list[DataFile] = []
    if not touched.num_rows:
        return removed, added
    # Every copy of a touched key goes. A Delta table has no unique key, and a
    # repeated key the expected state holds comes back with the upserts (the
    # engine's repair hands its expected row back), so one copy remains.
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    for action in actions:
        if action.get("deletion_vector.storage_type") or action.get("deletionVector"):
            raise InvalidInputError(  # the protocol check refuses this first
                f"Delta table {root}: file {action['path']!r} has a deletion "
                "vector; nothing was written",
                table=root,
            )
        path = f"{root.rstrip('/')}/{unquote(action['path'])}"
        held = pq.read_table(path, columns=keys).cast(typed)
        held = held.append_column("__row", pa.array(range(held.num_rows), pa.int64()))
        hit = held.join(touched, keys, join_type="left semi")
        if not hit.num_rows:
            continue
        rows = pq.read_table(path).select(schema.names).cast(schema)
        rows = rows.filter(pc.invert(pc.is_in(pa.array(range(rows.num_rows), pa.int64()),
                                              value_set=hit.column("__row"))))  # fmt: skip
        removed.append(
            DataFile(
                path=action["path"],
                size=int(action["size_bytes"]),
                num_records=int(action["num_records"] or 0),
                stats="",
                modification_time=_millis(action["modification_time"]),
            )
        )
        if rows.num_rows:
            added.append(write_data_file(root, _file_name(rewrite_id), rows))
    return removed, added
