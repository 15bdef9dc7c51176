"""Drift provenance: for a few differing rows, which transaction last wrote them, and whose it was.

After a diff, up to ``limit`` differing rows are traced (changed first, then
extra, then missing; each kind in key order): the sink is asked, in the same
snapshot, for those rows with their last writing transaction, its commit time,
and whether the engine recorded that transaction (a marker or a repair of this
pipeline and sink). A changed row also names the columns that differ from
the expected row. A sink that cannot say (any database but PostgreSQL, whose
rows carry no writer) gets a report that says so, never an error.

The decision for each row, as the report's ``writer``:

- ``engine``: its xid is one the engine recorded for this pipeline and sink;
- ``foreign``: it is not (a hand edit, another program, another pipeline);
- ``unknown``: the row is frozen, so its full xid cannot be rebuilt; or it is
  older than the sink's oldest kept marker, and not a repair's (``reconcile pg
  prune`` deletes old markers: the epoch that wrote it may be one of them);
- ``none``: the sink lacks the row (missing): no transaction wrote it.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import uuid
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.conform import conform
from reconcile.core.hashing import row_hash_arrow
from reconcile.core.target import WRITER_COLUMNS, SinkSnapshot
from reconcile.recovery.diff import Diff
from reconcile.recovery.source import ExpectedSource, semi

__all__ = [
    "DEFAULT_PROVENANCE_ROWS",
    "NOT_AVAILABLE",
    "Provenance",
    "WriterSnapshot",
    "sample",
    "trace",
]

# Differing rows traced by default: enough to tell a hand edit from a
# pipeline's, few enough that the query stays small.
DEFAULT_PROVENANCE_ROWS = 10
# Differing rows whose writers are counted (not traced one by one): the count
# follows the drift, bounded here; past it the note says of how many.
FOREIGN_COUNT_ROWS = 100_000
NOT_AVAILABLE = "not available on this sink: its rows do not carry their writing transaction"
UNREADABLE = "provenance could not be read"
NO_COMMIT_TIMES = (
    "commit times unknown: the server does not track them (track_commit_timestamp is off)"
)
XID, COMMITTED_AT, ENGINE, BEFORE = WRITER_COLUMNS


@runtime_checkable
class WriterSnapshot(Protocol):
    """A snapshot that can say who last wrote some of its rows (PostgreSQL's)."""

    def row_writers(self, keys: pa.Table) -> tuple[pa.Table | None, bool, str]:
        """(the rows of ``keys`` with ``_writer_xid``, ``_writer_committed_at``,
        ``_writer_engine`` and ``_writer_before_epoch``, whether the server tracks
        commit timestamps, "" or why the rows could not be read: then None)."""
        ...


@dataclass(frozen=True)
class Provenance:
    """What the trace found: one entry per traced row, a note, the foreign writes among them.

    ``foreign`` counts the traced rows a foreign transaction wrote;
    ``foreign_rows`` every differing row (changed or extra, up to
    ``FOREIGN_COUNT_ROWS`` of them) and ``foreign_transactions`` the distinct
    transactions among those: "10 foreign writes" said nothing of the 45 rows
    that really were.
    """

    rows: tuple[dict[str, Any], ...] = ()
    note: str = ""
    foreign: int | None = None
    foreign_rows: int | None = None
    foreign_transactions: int | None = None


def sample(diff: Diff, keys: list[str], limit: int) -> list[tuple[str, pa.Table]]:
    """Up to ``limit`` differing keys: (kind, keys), changed first, then extra, then missing."""
    out: list[tuple[str, pa.Table]] = []
    left = limit
    for kind, table in (("changed", diff.changed), ("extra", diff.extra),
                        ("missing", diff.missing)):  # fmt: skip
        if left <= 0:
            break
        if table.num_rows == 0:
            continue
        chosen = table.sort_by([(k, "ascending") for k in keys]).slice(0, left)
        out.append((kind, chosen))
        left -= chosen.num_rows
    return out


def _plain(value: Any) -> Any:
    """A key value as JSON holds it."""
    if isinstance(value, bytes):
        if len(value) == 16:
            return str(uuid.UUID(bytes=value))
        return base64.b64encode(value).decode()
    if isinstance(value, (decimal.Decimal, dt.date, dt.datetime, dt.time, uuid.UUID)):
        return value.isoformat() if hasattr(value, "isoformat") else str(value)
    return value


def _key(row: dict[str, Any], keys: list[str]) -> tuple[Any, ...]:
    return tuple(row[k] for k in keys)


def _differing(sink: pa.Table, expected: pa.Table, names: list[str]) -> list[str]:
    """The columns whose canonical hash differs between one sink row and one expected row."""
    return [
        name
        for name in names
        if row_hash_arrow(sink.select([name]))[0] != row_hash_arrow(expected.select([name]))[0]
    ]


def trace(snap: SinkSnapshot, source: ExpectedSource, diff: Diff, expected: pa.Table,
          keys: list[str], epoch: int, limit: int) -> Provenance:  # fmt: skip
    """Trace up to ``limit`` differing rows to their last writer (see the module's text).

    Args:
        snap: the snapshot the diff was made from (still open).
        source: the expected state.
        diff: what differed.
        expected: the expected rows the diff compared (with values, or only hashes).
        keys: the key columns.
        epoch: the epoch the sink was compared with.
        limit: the most rows to trace; 0 traces none.
    """
    if limit <= 0:
        return Provenance()
    if not isinstance(snap, WriterSnapshot):
        return Provenance(note=NOT_AVAILABLE)
    if diff.empty:
        # No drift is no foreign write: a watch's gauge falls back to 0 once repaired.
        return Provenance(foreign=0)
    chosen = sample(diff, keys, limit)
    schema = source.schema
    names = list(schema.names)
    held = [t.cast(pa.schema([schema.field(k) for k in keys])) for kind, t in chosen
            if kind != "missing"]  # fmt: skip
    writers: dict[tuple[Any, ...], dict[str, Any]] = {}
    rows_of: dict[tuple[Any, ...], pa.Table] = {}
    tracked = True
    if held:
        wanted = pa.concat_tables(held)
        raw, tracked, problem = snap.row_writers(wanted)
        if raw is None:
            # The verify goes on: what it found stands, only who wrote it is unknown.
            return Provenance(note=f"{UNREADABLE}: {problem}")
        rows, _bad = conform(raw.select(names), schema)
        meta = raw.select([XID, COMMITTED_AT, ENGINE, BEFORE]).to_pylist()
        for i, row in enumerate(rows.select(keys).to_pylist()):
            writers[_key(row, keys)] = meta[i]
            rows_of[_key(row, keys)] = rows.slice(i, 1)
    changed = [t for kind, t in chosen if kind == "changed"]
    values: dict[tuple[Any, ...], pa.Table] = {}
    if changed:
        scope = pa.concat_tables(changed)
        has_values = set(names) <= set(expected.column_names)
        wanted_rows = (
            semi(expected, scope, keys)
            if has_values
            else source.store.snapshot(epoch, columns=names, keys=scope)
        ).select(names)
        for i, row in enumerate(wanted_rows.select(keys).to_pylist()):
            values[_key(row, keys)] = wanted_rows.slice(i, 1)
    entries: list[dict[str, Any]] = []
    foreign = 0
    for kind, table in chosen:
        for row in table.to_pylist():
            key = _key(row, keys)
            entry: dict[str, Any] = {
                "kind": kind,
                "key": {k: _plain(row[k]) for k in keys},
                "columns": [],
                "xid": None,
                "committed_at": None,
                "writer": "none",
                "note": "",
            }
            if kind == "missing":
                entry["note"] = "the sink lacks this row: no transaction wrote it"
            elif key not in writers:
                # The diff saw the row in this same snapshot; it cannot have gone.
                entry["writer"], entry["note"] = "unknown", "the row was not found again"
            else:
                found = writers[key]
                if kind == "changed" and key in values:
                    entry["columns"] = _differing(rows_of[key], values[key], names)
                if found[XID] is None:
                    entry["writer"] = "unknown"
                    entry["note"] = (
                        "the row is frozen (older than the table's freeze horizon): its "
                        "transaction can no longer be told"
                    )
                else:
                    entry["xid"] = str(found[XID])
                    # The engine's only when a marker or a repair of this pipeline
                    # and sink recorded exactly this xid. Not recorded and older
                    # than the oldest marker kept: an epoch whose marker was
                    # pruned may have written it, so it is not called foreign.
                    # Anything else is foreign.
                    if found[ENGINE]:
                        entry["writer"] = "engine"
                    elif found[BEFORE] is not None:
                        entry["writer"] = "unknown"
                        entry["note"] = (
                            "older than the sink's oldest kept marker (epoch "
                            f"{found[BEFORE]}): an epoch whose marker was pruned, or a write "
                            "before the pipeline's first epoch"
                        )
                    else:
                        entry["writer"] = "foreign"
                        foreign += 1
                    at = found[COMMITTED_AT]
                    if at is not None:
                        entry["committed_at"] = at.isoformat()
                    elif not entry["note"]:
                        entry["note"] = (
                            NO_COMMIT_TIMES
                            if not tracked
                            else "the server recorded no commit time for this transaction "
                            "(it committed before track_commit_timestamp was on)"
                        )
            entries.append(entry)
    note = "" if tracked else NO_COMMIT_TIMES
    counted = _count_foreign(snap, diff, keys, source.schema, entries)
    if counted is None:
        return Provenance(tuple(entries), note, foreign)
    rows, transactions, every = counted
    if not every:
        more = f"foreign writes counted among the first {FOREIGN_COUNT_ROWS} differing rows"
        note = f"{note}; {more}" if note else more
    return Provenance(tuple(entries), note, foreign, rows, transactions)


def _count_foreign(snap: WriterSnapshot, diff: Diff, keys: list[str], schema: pa.Schema,
                   traced: list[dict[str, Any]]) -> tuple[int, int, bool] | None:  # fmt: skip
    """(rows, distinct transactions) a foreign transaction wrote among the differing rows.

    The traced entries answer when they are every changed and extra row;
    else the writers of those rows (up to ``FOREIGN_COUNT_ROWS``) are read in
    one more query. Whether every such row was counted is the third value;
    None: the writers could not be read.
    """
    held = diff.changed.num_rows + diff.extra.num_rows
    seen = [e for e in traced if e["kind"] != "missing"]
    if len(seen) == held:
        xids = [e["xid"] for e in seen if e["writer"] == "foreign"]
        return len(xids), len(set(xids)), True
    key_schema = pa.schema([schema.field(k) for k in keys])
    wanted = pa.concat_tables(
        [t.select(keys).cast(key_schema) for t in (diff.changed, diff.extra)]
    ).slice(0, FOREIGN_COUNT_ROWS)
    raw, _tracked, _problem = snap.row_writers(wanted)
    if raw is None:
        return None
    meta = raw.select([XID, ENGINE, BEFORE]).to_pylist()
    # The same decision as each traced row's (see trace).
    xids = [m[XID] for m in meta if m[XID] is not None and not m[ENGINE] and m[BEFORE] is None]
    return len(xids), len(set(xids)), held <= FOREIGN_COUNT_ROWS
