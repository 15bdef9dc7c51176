"""What the Iceberg sink records in its table's metadata, and the one commit that writes it.

Every epoch is ONE Iceberg snapshot whose summary carries ``reconcile.pipeline``,
``reconcile.sink``, ``reconcile.epoch``, ``reconcile.generation``,
``reconcile.txn`` and ``reconcile.log-id``: a replay finds its snapshot among
main's ancestors and writes nothing. Beside the snapshots, table properties
named ``reconcile.<pipeline>.<sink>.*`` hold:

- ``generation``: the newest writer generation (the fence);
- ``epoch``: the newest committed epoch (a high-water mark: an epoch above it
  is not in without reading any snapshot);
- ``log-id``: the progress log of the newest commit (the owner a repair
  records when an operator, not a writer, runs it);
- ``prepared.<epoch>``: a prepared epoch (``sinks.iceberg.prepared``).

How the generation fence works, in the commit itself:

1. Every commit of the sink is made with the catalog's requirements
   ``assert-table-uuid`` and ``assert-ref-snapshot-id`` (main is still the
   snapshot the commit was planned on). The fence, the high-water mark and
   the prepared record are read from that same metadata.
2. A writer of a newer generation claims the table, before it prepares
   anything, with a commit that raises ``generation`` AND adds an empty
   snapshot (summary ``reconcile.kind = claim``): it moves main. A table
   property alone would not do: the requirements cannot assert a property,
   and the catalog applies a property update to whatever metadata is current.
3. So a zombie's commit planned before the claim fails the catalog's
   ``assert-ref-snapshot-id`` (CommitFailedException: nothing was written),
   and one planned after it reads the newer generation and refuses itself.

The commit is made ONCE, by :func:`commit_once`: pyiceberg's own
``Transaction.commit_transaction`` retries a failed commit on a refreshed
base and drops the ``assert-ref-snapshot-id`` it failed on, which is exactly
what a fence must not do.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    AssertTableUUID,
    TableRequirement,
    TableUpdate,
    update_table_metadata,
)

from reconcile.core import hooks
from reconcile.core.claims import Claim
from reconcile.core.contract import FatalError, SinkTxnId

__all__ = [
    "BEFORE_CATALOG_COMMIT",
    "KIND_CLAIM",
    "KIND_EPOCH",
    "KIND_REPAIR",
    "BadPropertyError",
    "EpochRecord",
    "SinkKeys",
    "commit_once",
    "committed_snapshot",
    "epoch_summary",
    "int_property",
    "new_transaction",
    "our_snapshots",
    "table_name",
]

# Right before the catalog is asked to commit (the kill -9 tests arm it).
BEFORE_CATALOG_COMMIT = hooks.declare("iceberg_sink.commit.before_catalog")

KIND_EPOCH = "epoch"  # one epoch's changes
KIND_CLAIM = "claim"  # a newer generation's claim: no rows, it moves main
KIND_REPAIR = "repair"  # a pull-and-diff repair (it may stand for several epochs)

SUMMARY_PREFIX = "reconcile."
# An epoch or a generation as the sink writes it: a plain decimal int64.
_INTEGER = re.compile(r"0|-?[1-9][0-9]{0,18}")


@dataclass(frozen=True)
class SinkKeys:
    """The table property names of one (pipeline, sink)."""

    pipeline: str
    sink: str

    @classmethod
    def of(cls, txn_id: SinkTxnId) -> SinkKeys:
        """The names of ``txn_id``'s pipeline and sink."""
        return cls(txn_id.pipeline, txn_id.sink)

    @property
    def prefix(self) -> str:
        """``reconcile.<pipeline>.<sink>.``: names are [A-Za-z0-9_], so the dots split them."""
        return f"reconcile.{self.pipeline}.{self.sink}."

    @property
    def generation(self) -> str:
        """The fence: the newest writer generation."""
        return f"{self.prefix}generation"

    @property
    def epoch(self) -> str:
        """The high-water mark: the newest committed epoch."""
        return f"{self.prefix}epoch"

    @property
    def log_id(self) -> str:
        """The progress log of the newest commit."""
        return f"{self.prefix}log-id"

    def prepared(self, epoch: int) -> str:
        """The prepared record of ``epoch``."""
        return f"{self.prefix}prepared.{epoch}"


class BadPropertyError(FatalError):
    """A value the sink reads from the table's metadata is not what it writes there (a hand edit).

    A retry reads the same value again: the operation stops, naming the
    table, the property (or snapshot summary) and the value.
    """


def table_name(table: Table) -> str:
    """The table as messages name it (``namespace.table``)."""
    return ".".join(table.name())


def _int_value(value: object, where: str) -> int:
    """``value`` as an integer of the sink's own records, or BadPropertyError naming ``where``."""
    text = str(value)
    if not _INTEGER.fullmatch(text):
        raise BadPropertyError(
            f"{where} is {text[:100]!r}{' (cut)' if len(text) > 100 else ''}, not an integer "
            "as this sink writes it: a hand edit, or another program's. Nothing was read past "
            "it or written. Set it back (or remove it) once you know what wrote it.",
            value=text[:100],
        )
    return int(text)


def int_property(table: Table, name: str) -> int | None:
    """The integer table property ``name``; None if it is not set.

    Raises:
        BadPropertyError: it is set to something that is not an integer (a
            hand edit), naming the table, the property and the value.
    """
    value = table.metadata.properties.get(name)
    if value is None:
        return None
    return _int_value(value, f"table property {name!r} of Iceberg table {table_name(table)}")


def epoch_summary(
    txn_id: SinkTxnId, log_id: str | None, *, kind: str = KIND_EPOCH, first_epoch: int | None = None
) -> dict[str, str]:
    """The summary properties of a snapshot of ``txn_id``'s sink (values are strings)."""
    summary = {
        "reconcile.kind": kind,
        "reconcile.pipeline": txn_id.pipeline,
        "reconcile.sink": txn_id.sink,
        "reconcile.epoch": str(txn_id.epoch),
        "reconcile.generation": str(txn_id.generation),
        "reconcile.txn": str(txn_id),
    }
    if first_epoch is not None:
        summary["reconcile.first-epoch"] = str(first_epoch)
    if log_id is not None:
        summary["reconcile.log-id"] = log_id
    return summary


def our_snapshots(metadata: TableMetadata, keys: SinkKeys) -> Iterator[Snapshot]:
    """The snapshots of main's history written for (pipeline, sink), newest first.

    Only main's ancestors count: a snapshot left in the metadata but not on
    main (rolled back by an operator) holds nothing the table shows.
    """
    snapshot = metadata.current_snapshot()
    seen: set[int] = set()
    while snapshot is not None and snapshot.snapshot_id not in seen:
        seen.add(snapshot.snapshot_id)
        summary = snapshot.summary
        if (
            summary is not None
            and summary.get("reconcile.pipeline") == keys.pipeline
            and summary.get("reconcile.sink") == keys.sink
        ):
            yield snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = None if parent is None else metadata.snapshot_by_id(parent)


@dataclass(frozen=True)
class EpochRecord:
    """A snapshot that says epochs are in: one epoch's, or a repair's standing for several."""

    snapshot: Snapshot
    kind: str
    first_epoch: int
    epoch: int
    generation: int | None
    log_id: str | None
    txn: str | None

    def claim(self, sink: str, what: str, display: str) -> Claim:
        """What it claims, for ``reconcile.core.claims``."""
        return Claim(
            sink=sink,
            what=what,
            record=f"snapshot {self.snapshot.snapshot_id} of Iceberg table {display}",
            kind="repair" if self.kind == KIND_REPAIR else "commit",
            epoch=self.epoch,
            first_epoch=self.first_epoch,
            generation=self.generation,
        )


def _epoch_record(table: Table, snapshot: Snapshot) -> EpochRecord | None:
    """The epochs ``snapshot`` (one of our_snapshots) stands for; None: it stands for none."""
    summary = snapshot.summary
    assert summary is not None  # our_snapshots yields only snapshots with a summary
    kind = summary.get("reconcile.kind")
    if kind not in (KIND_EPOCH, KIND_REPAIR) or "reconcile.epoch" not in summary:
        return None  # a claim, or a repair of rows only: it stands for no epoch
    where = f"the summary of snapshot {snapshot.snapshot_id} of Iceberg table {table_name(table)}"
    last = _int_value(summary["reconcile.epoch"], f"reconcile.epoch in {where}")
    # (pyiceberg's Summary.get takes no default)
    first_text = summary.get("reconcile.first-epoch")
    first = last if not first_text else _int_value(first_text, f"reconcile.first-epoch in {where}")
    generation_text = summary.get("reconcile.generation")
    generation = (
        None
        if generation_text is None
        else _int_value(generation_text, f"reconcile.generation in {where}")
    )
    log_id, txn = summary.get("reconcile.log-id"), summary.get("reconcile.txn")
    return EpochRecord(snapshot, str(kind), first, last, generation,
                       None if log_id is None else str(log_id),
                       None if txn is None else str(txn))  # fmt: skip


def committed_snapshot(table: Table, txn_id: SinkTxnId) -> EpochRecord | None:
    """The snapshot that brought ``txn_id``'s epoch into the table; None if it is not in.

    An epoch is in when an epoch snapshot carries it, or a repair snapshot
    covers it (``first-epoch`` to ``epoch``, both included). Above the
    high-water mark nothing is read: the per-epoch path costs no walk of the
    history. The caller holds the record to what the store decided
    (``reconcile.core.claims``) before it trusts it.

    Raises:
        BadPropertyError: the high-water mark, or an epoch or generation in one
            of the sink's snapshot summaries, is not an integer.
    """
    keys = SinkKeys.of(txn_id)
    newest = int_property(table, keys.epoch)
    if newest is None or newest < txn_id.epoch:
        return None
    for snapshot in our_snapshots(table.metadata, keys):
        record = _epoch_record(table, snapshot)
        if record is not None and record.first_epoch <= txn_id.epoch <= record.epoch:
            return record
    return None


class _Transaction(Transaction):
    """pyiceberg's Transaction, its metadata computed once per set of staged updates.

    pyiceberg recomputes ``table_metadata`` (the loaded metadata with the staged
    updates applied, deep-copied) at every access, and a snapshot producer reads
    it a dozen times: a cost that grows with the table's history at every
    epoch. The staged updates are an immutable tuple, replaced when one is
    added, so the metadata computed for one tuple stays right until it changes.
    """

    _computed: tuple[tuple[TableUpdate, ...], TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        if self._computed is None or self._computed[0] is not self._updates:
            self._computed = (
                self._updates,
                update_table_metadata(self._table.metadata, self._updates),
            )
        return self._computed[1]


def new_transaction(table: Table) -> Transaction:
    """A transaction on ``table`` to stage updates in; :func:`commit_once` commits it."""
    return _Transaction(table, autocommit=False)


def commit_once(
    table: Table,
    transaction: Transaction,
    extra: tuple[TableUpdate, ...] = (),
) -> None:
    """Commit the transaction's staged updates once, on the snapshot ``table`` was loaded at.

    The requirements are the catalog's own check that nothing moved since
    ``table`` was read: the same table (``assert-table-uuid``) and the same
    main snapshot (``assert-ref-snapshot-id``; no snapshot yet: main must not
    exist). Whatever the transaction staged is replaced by them.

    Raises:
        CommitFailedException: a requirement failed (another commit came
            first); nothing was written. Any other exception: the outcome
            is unknown (the caller looks for its snapshot or record again).
    """
    requirements: tuple[TableRequirement, ...] = (
        AssertTableUUID(uuid=table.metadata.table_uuid),
        # (pydantic's alias is snapshot-id; pyiceberg builds it by this name too)
        AssertRefSnapshotId(ref="main", snapshot_id=table.metadata.current_snapshot_id),  # type: ignore[call-arg]
    )
    # pyiceberg keeps a transaction's staged updates in `_updates`; committing
    # them through the catalog ourselves is what keeps the commit from being
    # retried on another base (see the module's docstring).
    updates = tuple(transaction._updates) + extra
    hooks.point(BEFORE_CATALOG_COMMIT)
    table.catalog.commit_table(table, requirements, updates)
