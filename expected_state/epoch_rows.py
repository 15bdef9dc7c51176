"""The store's ``_epochs`` Delta table: streams of status rows, read incrementally, appended fenced.

One small Delta table per store holds status rows for many streams: each sink
table's :class:`~expected_state.epochs.EpochLog` (``sink`` = the table) and
each pipeline's progress log (``sink`` = ``"*"``). A stream's rows carry a
sequence number ``seq``; the row of an epoch with the highest ``seq`` is its
current status. The order is the commit order, never the epoch's number, so
an older epoch can move again (an aborted epoch decided once more).

Why ``seq`` is a total order of a stream: every commit of a stream carries its
fence token (``Transaction(<fence id>, generation)``), and delta-rs rejects a
commit when a commit it did not read carries the same app id. So each commit
of a stream is based on a snapshot holding every earlier commit of that
stream, and ``max(seq) + 1`` read on that snapshot is larger than any ``seq``
before it. Streams of different sinks or pipelines carry different tokens, and
their appends are rebased by delta-rs without failing each other.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from expected_state.delta_commit import (
    BasedOn,
    DataFile,
    DeltaCommit,
    commit_files,
    make_durable,
    write_data_file,
)
from expected_state.delta_files import read_data_files
from expected_state.delta_log import remember_written, transaction_version
from expected_state.layout import TOMBSTONE_RETENTION
from expected_state.protocol import create_config
from reconcile.core import hooks
from reconcile.core.contract import InvalidInputError

__all__ = [
    "APPEND_CHECKED",
    "EPOCHS_CONFIG",
    "EPOCHS_SCHEMA",
    "EPOCHS_TABLE",
    "PIPELINE_STREAM",
    "EpochRows",
]

EPOCHS_TABLE = "_epochs"
PIPELINE_STREAM = "*"  # the `sink` value of a pipeline's progress-log rows

# Between a stream's checks (its fence, the epoch's current status) and the
# commit of its rows: a takeover that lands here must still make the commit fail.
APPEND_CHECKED = hooks.declare("expected_state.epochs.append_checked")

# Removed files stay in checkpoints as tombstones as briefly as in the state
# tables (layout.TOMBSTONE_RETENTION, which says why).
EPOCHS_CONFIG = {
    "delta.checkpointInterval": "10",
    "delta.deletedFileRetentionDuration": TOMBSTONE_RETENTION,
}

EPOCHS_SCHEMA = pa.schema(
    [
        pa.field("pipeline", pa.string(), nullable=False),
        pa.field("sink", pa.string(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("xid", pa.string()),
        pa.field("generation", pa.int64(), nullable=False),
        pa.field("delta_version", pa.int64()),
        pa.field("rows_upserted", pa.int64(), nullable=False),
        pa.field("rows_deleted", pa.int64(), nullable=False),
        pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
    ]
)

# <kind>-<pipeline>-<sink tag>-<uuid>.parquet; names hold no "-", so the split is
# unambiguous, and the pipeline stream's tag is empty (no sink name is empty).
_FILE = re.compile(r"^(part|compact)-([A-Za-z0-9_]+)-([A-Za-z0-9_]*)-[0-9a-f]{32}\.parquet$")


class EpochRows:
    """One stream of the ``_epochs`` table: the rows of one (pipeline, sink) or one pipeline.

    Reading is incremental: each refresh reads only the files that appeared
    since the last one, and only rows with a ``seq`` above the newest one seen.
    """

    def __init__(self, root: str, pipeline: str, sink: str, fence_id: str) -> None:
        """A stream of the epochs table under store ``root``.

        Args:
            root: the store root (path or URI).
            pipeline: the pipeline name.
            sink: the sink table name, or :data:`PIPELINE_STREAM`.
            fence_id: the app id under which the stream's writers record their generation.
        """
        self.uri = f"{root.rstrip('/')}/{EPOCHS_TABLE}"
        self.pipeline = pipeline
        self.sink = sink
        self.fence_id = fence_id
        self._tag = "" if sink == PIPELINE_STREAM else sink
        self._prefixes = (f"part-{pipeline}-{self._tag}-", f"compact-{pipeline}-{self._tag}-")
        self._table: DeltaTable | None = None
        self._seen: set[str] = set()
        self._live: tuple[list[str], list[int]] = ([], [])
        self.max_seq = 0

    @property
    def files(self) -> list[DataFile]:
        """The stream's own live files, as of the last refresh (what compaction replaces)."""
        paths, sizes = self._live
        return [
            DataFile(p, int(size or 0), 0, "", 0)
            for p, size in zip(paths, sizes, strict=True)
            if p.startswith(self._prefixes)
        ]

    def file_count(self) -> int:
        """How many live files the stream has, as of the last refresh."""
        return sum(1 for p in self._live[0] if p.startswith(self._prefixes))

    # -- reading ---------------------------------------------------------------

    def open(self, *, create: bool) -> DeltaTable | None:
        """The epochs table at its newest version (created if ``create``), or None."""
        if self._table is None:
            try:
                self._table = DeltaTable(self.uri)
            except TableNotFoundError:
                if not create:
                    return None
                # ``ignore``: a concurrent creator wins harmlessly, and its table
                # identity (metaData.id) is the one everybody reads.
                DeltaTable.create(
                    self.uri,
                    EPOCHS_SCHEMA,
                    mode="ignore",
                    configuration=create_config(EPOCHS_SCHEMA, EPOCHS_CONFIG),
                )
                make_durable(self.uri, 0, 0)
                self._table = DeltaTable(self.uri)
            stored = pa.schema(self._table.schema().to_arrow())
            if stored.get_field_index("seq") < 0:
                raise InvalidInputError(
                    f"table {self.uri!r} has no 'seq' column: it was written by an older layout "
                    "of the epochs table; nothing was written",
                    table=self.uri,
                    column="seq",
                )
        else:
            self._table.update_incremental()
        return self._table

    def refresh(self, *, create: bool = False) -> tuple[DeltaTable | None, pa.Table]:
        """Bring the snapshot up to date and return the stream's new rows, in ``seq`` order.

        Returns:
            The snapshot (None if the table does not exist and ``create`` is False),
            and the rows of this stream with a ``seq`` above every one returned before.
        """
        table = self.open(create=create)
        if table is None:
            return None, EPOCHS_SCHEMA.empty_table()
        actions = pa.table(table.get_add_actions(flatten=False)).select(["path", "size_bytes"])
        paths: list[str] = actions.column("path").to_pylist()
        self._live = (paths, actions.column("size_bytes").to_pylist())
        # A file of another stream is never opened; a file of no stream (e.g. left
        # by a generic OPTIMIZE) may hold this stream's rows, so it is read.
        unread = [
            p
            for p in paths
            if p not in self._seen
            and (p.startswith(self._prefixes) or not _FILE.match(p.rsplit("/", 1)[-1]))
        ]
        self._seen = set(paths)
        if not unread:
            return table, EPOCHS_SCHEMA.empty_table()
        data = read_data_files(self.uri, unread, schema=EPOCHS_SCHEMA)
        data = data.filter(
            pc.and_(
                pc.equal(data.column("pipeline"), self.pipeline),
                pc.and_(
                    pc.equal(data.column("sink"), self.sink),
                    pc.greater(data.column("seq"), self.max_seq),
                ),
            )
        )
        if data.num_rows == 0:
            return table, EPOCHS_SCHEMA.empty_table()
        data = data.sort_by("seq")
        self.max_seq = max(self.max_seq, int(pc.max(data.column("seq")).as_py()))
        return table, data

    def generation(self, table: DeltaTable) -> int | None:
        """The newest generation recorded for the stream's fence in ``table``.

        At the version of this stream's own last commit it is the one that
        commit wrote (``remember_written``), not read back.
        """
        return transaction_version(table, self.fence_id)

    # -- writing ---------------------------------------------------------------

    def append(
        self,
        table: DeltaTable,
        rows: Sequence[Mapping[str, Any]],
        *,
        generation: int,
        landed: Callable[[], bool] | None = None,
        remove: Iterable[DataFile] = (),
        kind: str = "part",
    ) -> pa.Table | None:
        """Append ``rows`` in ONE commit based on ``table``, fenced by ``generation``.

        The caller has made its checks (fence, current status) on ``table``, the
        snapshot this commit is based on; the commit carries the fence token, so a
        takeover that lands after that snapshot makes it fail (FencedError).

        Args:
            table: the snapshot the caller checked.
            rows: the rows, without ``pipeline``, ``sink``, ``seq`` (filled in here);
                missing optional columns are NULL or 0, ``recorded_at`` now.
            generation: the writer's generation.
            landed: after a failed commit, whether its effect is in the log anyway
                (default: whether the file written here is live).
            remove: files of the stream to remove in the same commit (compaction).
            kind: "part" (new rows) or "compact" (a rewrite of the stream).

        Returns:
            The rows as written (with their ``seq``) if this call committed them,
            for the caller to fold into its state; None if ``landed()`` found the
            effect in the log already.

        Raises:
            FencedError: a newer generation holds the stream; nothing was written.
            RetryableError: lost to concurrent writers; nothing was written.
        """
        now = datetime.now(UTC)
        first = self.max_seq + 1
        data = pa.table(
            {
                "pipeline": [self.pipeline] * len(rows),
                "sink": [self.sink] * len(rows),
                "epoch": [int(r["epoch"]) for r in rows],
                "status": [str(r["status"]) for r in rows],
                "xid": [r.get("xid") for r in rows],
                "generation": [int(r.get("generation", generation)) for r in rows],
                "delta_version": [r.get("delta_version") for r in rows],
                "rows_upserted": [int(r.get("rows_upserted", 0)) for r in rows],
                "rows_deleted": [int(r.get("rows_deleted", 0)) for r in rows],
                "recorded_at": [r.get("recorded_at") or now for r in rows],
                "seq": list(range(first, first + len(rows))),
            },
            schema=EPOCHS_SCHEMA,
        )
        name = f"{kind}-{self.pipeline}-{self._tag}-{uuid.uuid4().hex}.parquet"
        data_file = write_data_file(self.uri, name, data)

        def file_is_live() -> bool:
            return name in _live_paths(self.uri)

        hooks.point(APPEND_CHECKED)
        based_on = table.version()
        rows_commit = DeltaCommit(
            table_uri=self.uri,
            schema=EPOCHS_SCHEMA,
            app_id=self.fence_id,
            version=generation,
            add=[data_file],
            remove=list(remove),
            fence=(self.fence_id, generation),  # checked on `table`, the commit's snapshot
            check_schema=False,  # written from EPOCHS_SCHEMA just above
        )
        result = commit_files(rows_commit, BasedOn(table, landed=landed or file_is_live))
        if not result.committed:
            return None
        if result.table_version == based_on + 1:
            # Nothing but our commit after our snapshot: its fence is ours.
            remember_written(table, based_on + 1, {self.fence_id: generation})
        # The caller folds our rows into its state: no need to read them back.
        self._seen.add(name)
        self._live = (self._live[0] + [name], self._live[1] + [data_file.size])
        self.max_seq = first + len(rows) - 1
        return data


def _live_paths(uri: str) -> list[str]:
    """The live file paths of the table at its newest version (a fresh read)."""
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=False))
    return [str(p) for p in actions.column("path").to_pylist()]
