"""The expected state of a pipeline's sink tables, as the commit cycle records and replays it.

One :class:`ExpectedStateStore` per sink that has one (a sink table with key
columns), all under one store root, plus the store's progress log (its epochs
table), which then is the pipeline's progress log: no separate progress file.

The cycle records each epoch's outputs here at the commit point, then writes
the decision; see ``CommitCycle`` for the order and what recovery does with it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.changes import EpochChanges
from expected_state.epoch_file import EpochFile
from expected_state.housekeeping import DEFAULT_RETENTION_HOURS, DEFAULT_SAFETY_MARGIN_MINUTES
from expected_state.progress_log import StoreProgressLog
from expected_state.store import ExpectedStateStore
from reconcile.core import hooks
from reconcile.core.contract import (
    Change,
    ConfigurationError,
    InvalidInputError,
    ReconcileError,
    validate_name,
)
from reconcile.core.metrics import Metrics, timed
from reconcile.core.schema_change import SchemaChange
from reconcile.core.staged import StagedEpoch
from reconcile.engine.expected_schemas import SinkSchemas
from reconcile.engine.schema_plan import with_declared_types

__all__ = ["HOUSEKEEPING", "OP_COLUMN", "ExpectedState", "as_changes"]

OP_COLUMN = "_op"

log = logging.getLogger("reconcile.expected")

# On the housekeeping thread, before the tables are maintained between epochs.
HOUSEKEEPING = hooks.declare("expected.housekeeping")


def as_changes(sink: str, rows: Iterable[Any]) -> list[Change] | pa.Table:
    """A sink's outputs as store changes: dicts are upserts, Changes stay, Arrow gets ``_op``.

    Raises:
        InvalidInputError: an item that is no row, naming the sink and its index.
    """
    if isinstance(rows, pa.Table):
        if OP_COLUMN in rows.column_names:
            return rows
        return rows.append_column(OP_COLUMN, pa.array(["upsert"] * rows.num_rows, pa.string()))
    changes: list[Change] = []
    for index, item in enumerate(rows):
        if isinstance(item, Change):
            changes.append(item)
        elif isinstance(item, Mapping):
            changes.append(Change("upsert", item))
        else:
            raise InvalidInputError(
                f"sink {sink!r}: output {index} is a {type(item).__name__}, not a row (a dict), "
                "a Change or an Arrow table; nothing was written",
                sink=sink,
            )
    return changes


class ExpectedState(SinkSchemas):
    """The expected state of one pipeline: a store table per keyed sink, and the progress log.

    Args:
        root: the store root (a local path or a URI deltalake understands).
        pipeline: the pipeline's name.
        keys: sink name -> its key columns. Sinks not listed have no expected
            state (they are not pulled and diffed; an epoch they lack after a
            crash is replayed from the outputs, as without a store).
        schemas: sink name -> the store table's schema (keys and values, Arrow
            types), optional. See below.
        retention_hours: how long the housekeeping between epochs keeps a file
            no kept or held version references, for readers of old versions other
            than the engine's (``vacuum``'s, hours, any fraction, default 0).
        safety_margin_minutes: such a file last written more recently than this
            is kept in any case (``vacuum``'s, default 10): change files written
            ahead of their commit, as Spark executors write them while it runs.

    Where each store table's column types come from (they are fixed once the
    table exists: the row hash depends on them):

    - ``schemas=``, if given for the sink, is taken as it is by a new table; a
      value that does not fit it is refused when the epoch is staged. For an
      existing table it is the target of a schema change, evolved in place
      or refused (``reconcile.engine.schema_plan``, docs/changing.md);
    - else an existing store table keeps its schema; ``CommitCycle.start()``
      refuses one that cannot hold every value the sink's table can (a store
      ``decimal128(5,2)`` for a sink ``numeric(12,2)``), naming the column and
      both types, rather than letting a later epoch fail;
    - else, for a sink with a table (Postgres, SQL, Delta: their
      ``arrow_schema()``), the sink table's types, which ``start()`` reads when
      it binds the sinks: ``numeric(12,2)`` is stored as ``decimal128(12,2)``
      whatever the first epoch's values. The columns are those the first epoch
      gives (a column left to its default in the sink is not in the store); an
      epoch without rows before any with rows takes every column the sink types;
    - else (a sink without a table: memory, files, HTTP) the types are inferred
      from the first epoch's values, widened for later ones: a decimal keeps
      its scale and gets 38 digits (``Decimal("123.45")`` becomes
      ``decimal128(38,2)``). Inference is kept for these sinks, rather than
      requiring ``schemas=``, because such a sink holds whatever it is given:
      there is no declared column type the store could disagree with, only
      later values that could outgrow a guess, which the widening covers. A
      value with more decimal places than the first epoch's is refused when
      staged, naming both types; give ``schemas=`` to fix the scale.

    ``expected_state.column_types`` has the rules.
    """

    def __init__(
        self,
        root: str,
        pipeline: str,
        keys: Mapping[str, Sequence[str]],
        *,
        schemas: Mapping[str, pa.Schema] | None = None,
        retention_hours: float = DEFAULT_RETENTION_HOURS,
        safety_margin_minutes: float = DEFAULT_SAFETY_MARGIN_MINUTES,
    ) -> None:

        self.root = str(root)
        self.pipeline = validate_name("pipeline", pipeline)
        if not keys:
            raise ConfigurationError(
                f"pipeline {pipeline!r}: an expected state needs the key columns of at least "
                "one sink (keys={'<sink>': ['<column>', ...]})"
            )
        self.keys = {validate_name("sink", s): list(k) for s, k in keys.items()}
        for name, value in (("retention_hours", retention_hours),
                            ("safety_margin_minutes", safety_margin_minutes)):  # fmt: skip
            # bool is refused too; nan and inf fail the comparison.
            if type(value) not in (int, float) or not 0 <= value < float("inf"):
                raise ConfigurationError(
                    f"pipeline {pipeline!r}: {name} must be a number >= 0, got {value!r}"
                )
        self.retention_hours = retention_hours
        self.safety_margin_minutes = safety_margin_minutes
        self.schemas = dict(schemas or {})
        unknown = sorted(set(self.schemas) - set(self.keys))
        if unknown:
            raise ConfigurationError(
                f"pipeline {pipeline!r}: schemas= names {unknown}, which have no key columns "
                f"in keys= ({sorted(self.keys)})"
            )
        # The sink tables' column types, as start() reads them (sink name -> schema).
        self.sink_types: dict[str, pa.Schema] = {}
        self.progress = StoreProgressLog(self.root, pipeline)
        self._tables: dict[str, ExpectedStateStore] = {}
        # An epoch's outputs as each table's changes, converted when it was staged,
        # and their change files being written ahead on the store's own thread
        # (until record() hands each to its table's commit).
        self._staged: dict[str, tuple[int, EpochChanges]] = {}
        # The schema changes the staged epoch brings (sink name -> change).
        self._changes: dict[str, SchemaChange] = {}
        self._ahead: dict[str, Future[EpochFile | None]] = {}
        # Housekeeping running between epochs on a thread of its own (see
        # maintain_in_background), and that thread, started on first use.
        self._housekeeping: Future[dict[str, dict[str, Any]]] | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._open(generation=0)

    @property
    def tables(self) -> dict[str, ExpectedStateStore]:
        """Sink name -> its store table; waits first for housekeeping still running.

        Every use of a table goes through here, so that the tables have one
        user at a time: the housekeeping thread, or whoever asks next.
        """
        self.settle()
        return self._tables

    def _open(self, *, generation: int) -> None:
        self.settle()  # housekeeping still running uses the tables about to be replaced
        self._tables = {
            sink: ExpectedStateStore(
                self.root,
                self.pipeline,
                sink,
                key_columns,
                schema=self.schemas.get(sink),
                generation=generation,
                column_types=self.sink_types.get(sink),
            )
            for sink, key_columns in self.keys.items()
        }

    def check_sinks(self, sinks: Iterable[str]) -> None:
        """Every keyed name must be a sink of the pipeline (a typo would record nothing)."""
        unknown = sorted(set(self.keys) - set(sinks))
        if unknown:
            raise ConfigurationError(
                f"pipeline {self.pipeline!r}: expected state for {unknown}, which are not its "
                f"sinks ({sorted(sinks)})"
            )

    def stage(self, epoch: int, outputs: Mapping[str, Iterable[Any]]) -> dict[str, SchemaChange]:
        """Convert ``epoch``'s outputs to each table's schema, before anything is decided.

        The cycle calls this in its stage step, before any sink stages: a value
        the store cannot hold (a decimal wider than its column, say) stops the
        epoch there, before the store commit and before any sink's prepare, not
        at the commit point. ``record`` then writes what was converted here.
        Rows that Spark executors staged (a ``StagedEpoch``) were converted by
        the executors.

        An epoch whose rows bring a new nullable column (or whose ``schemas=``
        entry declares a widening) evolves its table's schema in this epoch
        (``reconcile.engine.schema_plan``); the changes are returned, sink by
        sink, for the sinks to evolve their tables in the same epoch.

        Raises:
            InvalidInputError: naming the sink, the epoch, the column, the value
                and both types (the store's, and the sink column's where known);
                or a schema change that cannot be made in place
                (``SchemaChangeRefused``), naming the column; nothing was written.
        """
        self.discard_staged()
        changes: dict[str, SchemaChange] = {}
        for sink, store in self.tables.items():
            rows = outputs.get(sink, ())
            if isinstance(rows, StagedEpoch):
                continue
            try:
                given = as_changes(sink, rows)
                change = self._plan(sink, store, given)
                if change is not None:
                    store.evolve(change)  # in memory until record() commits it
                    changes[sink] = change
                    self._changes[sink] = change
                net = store.normalize(given)
            except InvalidInputError as err:
                details = {**err.details, "sink": sink, "epoch": epoch}
                raise type(err)(f"sink {sink!r}, epoch {epoch}: {err.message}", **details) from None
            self._staged[sink] = (epoch, net)
        # The row hashes and the change files need nothing of the tables' logs:
        # they are written now, on the store's thread, while the sinks stage and
        # prepare the epoch, so that the commit point is left with the commits.
        worker = self._thread()
        self._ahead = {sink: worker.submit(self._tables[sink].write_ahead, epoch, net)
                       for sink, (_, net) in self._staged.items()}  # fmt: skip
        return changes

    def discard_staged(self) -> None:
        """Forget what ``stage`` converted (the epoch was aborted), and its files written ahead.

        Only files never handed to a table's commit are removed: one that
        ``record`` handed over may be in the table (a commit whose outcome is
        unknown), and is left to the table (``revert``, or vacuum once orphaned).
        """
        ahead, self._staged, self._ahead = self._ahead, {}, {}
        self._changes = {}
        for store in self._tables.values():
            store.abandon_evolution()
        for sink, future in ahead.items():
            try:
                written = future.result()
            except Exception as exc:  # nothing was written, or an orphan for vacuum
                log.warning("pipeline %s: a change file of %s written ahead failed: %s",
                            self.pipeline, sink, exc)  # fmt: skip
                continue
            if written is not None:
                self._tables[sink].discard_ahead(written)

    def claim(self, generation: int) -> None:
        """Write as ``generation`` from now on, fencing older writers in every table.

        A table that does not exist yet is claimed by its first ``apply``.
        """
        self.discard_staged()  # an epoch staged by the writer before is not this one's
        self._open(generation=generation)
        for store in self.tables.values():
            if store.user_schema is not None:
                store.claim()

    def record(self, epoch: int, outputs: Mapping[str, Iterable[Any]]) -> None:
        """Record ``epoch``'s outputs in every table (idempotent: a recorded epoch is kept).

        Raises:
            InvalidInputError, FencedError, RetryableError, OutcomeUnknownError:
                from the store (see ExpectedStateStore.apply).
        """
        staged, ahead, self._staged, self._ahead = self._staged, self._ahead, {}, {}
        changes, self._changes = self._changes, {}
        for sink, change in changes.items():
            # The sink takes the declared types in this epoch: planning the next
            # epoch against its old types would ask for the change again.
            if sink in self.sink_types:
                self.sink_types[sink] = with_declared_types(self.sink_types[sink], change.after)
        for sink, store in self.tables.items():
            rows = outputs.get(sink, ())
            if isinstance(rows, StagedEpoch):
                # Executors wrote the change files: add them, read nothing.
                store.apply_parts(epoch, rows.store_files, upserted=rows.upserted,
                                  deleted=rows.deleted, allow_gap=True)  # fmt: skip
            elif sink in staged and staged[sink][0] == epoch:
                # Converted by stage(), its file written ahead (None: a table
                # that did not exist, which apply creates and writes itself).
                written = ahead.pop(sink).result()
                store.apply(epoch, written or staged[sink][1], allow_gap=True)
            else:
                store.apply(epoch, as_changes(sink, rows), allow_gap=True)

    def revert_undecided(self, decided: int | None) -> list[tuple[str, int]]:
        """Undo what ``record`` wrote for an epoch past ``decided`` (never decided).

        Epochs run in order and one at a time, so only each table's newest
        epoch can be undecided. Returns the (sink, epoch) pairs reverted.
        """
        reverted = []
        for sink, store in self.tables.items():
            last = store.last_epoch()
            if last is not None and (decided is None or last > decided):
                store.revert(last)
                reverted.append((sink, last))
        return reverted

    def maintain(self, verified_epoch: int) -> dict[str, dict[str, Any]]:
        """The store's housekeeping that is due, table by table (between epochs).

        Merge-on-read keeps an epoch's cost in proportion to its own rows only
        if the change files and the Delta log are folded and pruned now and
        then (``ExpectedStateStore.maintain``: cheap when nothing is due). The
        change files from ``verified_epoch`` on are kept, which scoped recovery
        and bucket summaries read. A failure is logged, never raised: the epoch
        it follows is committed in every sink, and the next call tries again.
        """
        self.settle()
        return self._maintain(verified_epoch)

    def _maintain(self, verified_epoch: int) -> dict[str, dict[str, Any]]:
        # The housekeeping thread runs this: through _tables, since the `tables`
        # property would wait for the very housekeeping it is part of.
        done: dict[str, dict[str, Any]] = {}
        for sink, store in self._tables.items():
            if store.user_schema is None:
                continue
            try:
                done[sink] = store.maintain(
                    keep_from_epoch=verified_epoch,
                    retention_hours=self.retention_hours,
                    safety_margin_minutes=self.safety_margin_minutes,
                )
            except ReconcileError as exc:
                log.warning("pipeline %s: housekeeping of the expected state of %s deferred: %s",
                            self.pipeline, sink, exc)  # fmt: skip
        return done

    def maintain_in_background(self, verified_epoch: int, metrics: Metrics) -> None:
        """Start ``maintain(verified_epoch)`` on the store's own thread, and return at once.

        What is due now and then (a merge of change files, a vacuum, a
        checkpoint) then costs no epoch its latency: it runs while the next
        micro-batch is read and transformed, and the next use of the tables
        (``tables``: the next epoch's staging, a restart, ``close``) waits
        for it. A failure is logged, as ``maintain`` does: housekeeping
        deferred loses nothing, and the epoch it follows is committed.
        """
        self.settle()
        worker = self._thread()

        def run() -> dict[str, dict[str, Any]]:
            with timed(metrics, "cycle.housekeeping"):
                try:
                    hooks.point(HOUSEKEEPING)
                    return self._maintain(verified_epoch)
                except Exception:
                    log.exception("pipeline %s: housekeeping of the expected state failed",
                                  self.pipeline)  # fmt: skip
                    return {}

        self._housekeeping = worker.submit(run)

    def _thread(self) -> ThreadPoolExecutor:
        """The store's own thread (started on first use): housekeeping, files written ahead."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="reconcile-store")
        return self._worker

    def settle(self) -> dict[str, dict[str, Any]] | None:
        """Wait for housekeeping running in the background; what it did (None: none ran)."""
        running = self._housekeeping
        if running is None:
            return None
        done = running.result()
        self._housekeeping = None
        return done

    def close(self) -> None:
        """Wait for the work on the store's own thread, and stop that thread."""
        self.settle()
        self.discard_staged()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    def changes_of(self, sink: str, epoch: int) -> pa.Table:
        """The changes recorded for ``sink`` in ``epoch`` (what its sink must receive)."""
        return self.tables[sink].changes_of(epoch)
