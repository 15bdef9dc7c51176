"""Checking a store table before recovery trusts it: its commits, and every file a read uses.

Two checks, both against the Delta log, which records for every data file its
size, its row count and its statistics (``_epoch`` and ``_row_hash`` min/max):

* the commits (:class:`LogAudit`): the log is replayed commit by commit,
  incrementally. A commit is the engine's when its commitInfo carries
  ``reconcile.app_id`` equal to the table's app id (an epoch, a revert) or to
  its fence id (a claim, a compaction), or when it is version 0's
  ``CREATE TABLE``. Every other commit is foreign. A snapshot is trusted when
  the data files it holds are exactly those the engine's own commits leave
  live at its version, each as the engine's commit described it. So a foreign
  ``DELETE``, ``OPTIMIZE`` or an ``add`` of a file is refused, while a foreign
  commit that leaves the files as the engine left them is not: a vacuum's
  start and end markers, a property change, or a ``RESTORE`` to an engine
  version (what an operator runs to undo a hand delete);
* the files (:func:`check_footer`): before a read uses a file, its Parquet
  footer (a few kilobytes at its end, not its rows) is compared with the
  file's log entry: size, row count, ``_epoch`` and ``_row_hash`` bounds, and
  the epochs its name says it holds. A file emptied or replaced on disk, with
  its log entry untouched, is caught here.

A store that lost rows is reported as such (:class:`StoreLostRowsError`,
naming the files and the epochs), never left for a repair to read as "extra"
sink rows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]

from expected_state.delta_files import filesystem
from expected_state.layout import EPOCH_COLUMN, ROW_HASH_COLUMN, StoreFile, classify
from reconcile.core.contract import InvalidInputError, StoreIntegrityError, StoreLostRowsError

__all__ = [
    "ENGINE_APP_KEY",
    "LogAudit",
    "LogEntry",
    "check_footer",
    "epochs_of",
    "refuse_files",
]

# The commitInfo field every engine commit carries (expected_state.delta_commit).
ENGINE_APP_KEY = "reconcile.app_id"
_JSON = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet$")
# How many files and commits an error names (the details carry them all).
_NAMED = 5


@dataclass(frozen=True, slots=True)
class LogEntry:
    """What the log says of one data file (the fields that describe its rows)."""

    size: int
    records: int | None
    epochs: tuple[int, int] | None  # _epoch min, max
    hashes: tuple[int, int] | None  # _row_hash min, max
    deletion_vector: bool = False

    @classmethod
    def from_add(cls, add: Mapping[str, Any]) -> LogEntry:
        """The entry of a Delta ``add`` action (as in a commit file or a checkpoint)."""
        stats = add.get("stats")
        parsed: dict[str, Any] = {}
        if isinstance(stats, str) and stats:
            try:
                parsed = json.loads(stats)
            except ValueError:
                parsed = {}
        low = parsed.get("minValues") or {}
        high = parsed.get("maxValues") or {}
        records = parsed.get("numRecords")
        return cls(
            size=int(add.get("size") or 0),
            records=int(records) if isinstance(records, int) else None,
            epochs=_bounds(low, high, EPOCH_COLUMN),
            hashes=_bounds(low, high, ROW_HASH_COLUMN),
            deletion_vector=bool(add.get("deletionVector")),
        )


def _bounds(low: Mapping[str, Any], high: Mapping[str, Any], name: str) -> tuple[int, int] | None:
    lo, hi = low.get(name), high.get(name)
    if isinstance(lo, int) and isinstance(hi, int):
        return lo, hi
    return None


@dataclass
class _Blame:
    """The foreign commit that last touched a file, for the message."""

    version: int
    operation: str


@dataclass
class LogAudit:
    """A store table's log replayed: the files the engine left live, and where others differ.

    Args:
        uri: the table's root.
        engine_ids: the commitInfo ``reconcile.app_id`` values of the engine's commits.
    """

    uri: str
    engine_ids: frozenset[str]
    upto: int = -1  # the newest version replayed
    start: int = 0  # the oldest version audited (a checkpoint's, once vacuum pruned the log)
    entries: dict[str, LogEntry] = field(default_factory=dict)  # every file the engine added
    _removed: dict[str, int] = field(default_factory=dict)  # file -> the engine commit removing it
    _ours: dict[str, LogEntry] = field(default_factory=dict)  # live by the engine's commits
    _actual: dict[str, LogEntry] = field(default_factory=dict)  # live by every commit
    _divergent: set[str] = field(default_factory=set)
    _blame: dict[str, _Blame] = field(default_factory=dict)
    _tainted: set[int] = field(default_factory=set)

    def update(self, version: int) -> None:
        """Replay the commits after the last one replayed, up to ``version``.

        Raises:
            StoreIntegrityError: a commit file is missing or unreadable (naming it).
        """
        if version <= self.upto:
            return
        fs, root = filesystem(self.uri)
        log_dir = f"{root}/_delta_log"
        if self.upto < 0:
            self._baseline(fs, log_dir)
        for v in range(self.upto + 1, version + 1):
            self._replay(v, _read_commit(fs, log_dir, v, self.uri))
            self.upto = v

    def _baseline(self, fs: pafs.FileSystem, log_dir: str) -> None:
        """Where the replay starts: version 0, or the checkpoint vacuum kept as the oldest entry.

        The engine prunes the log only in ``vacuum()``, which audits it first, so
        the commits folded into that checkpoint were audited when it ran.
        """
        infos = fs.get_file_info(pafs.FileSelector(log_dir, allow_not_found=True))
        versions = sorted(int(m.group(1)) for i in infos if (m := _JSON.match(i.base_name)))
        if not versions or versions[0] == 0:
            self.upto = -1
            return
        first = versions[0]
        parts = sorted(
            i.path
            for i in infos
            if (m := _CHECKPOINT.match(i.base_name)) and int(m.group(1)) == first
        )
        if not parts:
            raise StoreIntegrityError(
                f"expected-state table {self.uri!r}: its log starts at version {first} without "
                "a checkpoint there: the commits before it cannot be audited; recovery will not "
                "trust this store; nothing was written",
                table=self.uri,
            )
        for part in parts:
            with fs.open_input_file(part) as handle:
                adds = pq.read_table(handle, columns=["add"]).column("add").to_pylist()
            for add in adds:
                if add:
                    entry = LogEntry.from_add(add)
                    path = str(add["path"])
                    self.entries[path] = self._ours[path] = self._actual[path] = entry
        self.start = first
        self.upto = first

    def _replay(self, version: int, actions: list[dict[str, Any]]) -> None:
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        # The engine creates its tables empty (DeltaTable.create cannot carry its
        # fields): a version 0 that adds files was written by someone else.
        created = (
            version == 0
            and info.get("operation") == "CREATE TABLE"
            and not any("add" in a for a in actions)
        )
        ours = info.get(ENGINE_APP_KEY) in self.engine_ids or created
        touched: list[str] = []
        for action in actions:
            if "add" in action:
                path = str(action["add"]["path"])
                entry = LogEntry.from_add(action["add"])
                self._actual[path] = entry
                if ours:
                    self._ours[path] = self.entries[path] = entry
                    self._removed.pop(path, None)
                touched.append(path)
            elif "remove" in action:
                path = str(action["remove"]["path"])
                self._actual.pop(path, None)
                if ours:
                    self._ours.pop(path, None)
                    self._removed[path] = version
                touched.append(path)
        for path in touched:
            if self._ours.get(path) == self._actual.get(path):
                self._divergent.discard(path)
                self._blame.pop(path, None)
            else:
                self._divergent.add(path)
                if not ours:
                    self._blame[path] = _Blame(version, str(info.get("operation") or "unknown"))
        if self._divergent:
            self._tainted.add(version)

    def forget_before(self, version: int) -> None:
        """Forget what only versions before ``version`` needed, once the log was pruned there.

        No read can use such a version any more, so the entries of the files the
        engine removed at or before it go (a reader opened now would not know them
        either: its replay starts from that checkpoint), and so does the taint of
        those versions. Without this a long-lived writer keeps an entry for every
        file it ever wrote: memory that grows with every epoch.
        """
        gone = [path for path, removed in self._removed.items() if removed <= version]
        for path in gone:
            del self._removed[path]
            self.entries.pop(path, None)
        self._tainted = {v for v in self._tainted if v >= version}

    def check(self, version: int, *, table: str) -> None:
        """Raise unless the files live at ``version`` are exactly the engine's.

        Raises:
            StoreLostRowsError: a file the engine's commits left live is gone
                from the table, or holds other rows than the engine recorded.
            StoreIntegrityError: the table holds a file the engine did not add.
        """
        self.update(version)
        if version not in self._tainted:
            return
        if version != self.upto:
            raise StoreIntegrityError(
                f"expected-state table {table!r}: version {version} holds files that commits "
                "the engine did not write changed (undone since): the state of its epoch cannot "
                "be trusted; nothing was written",
                table=table,
                version=version,
            )
        lost = sorted(p for p in self._divergent if p in self._ours)
        alien = sorted(p for p in self._divergent if p not in self._ours)
        commits = sorted(
            {(b.version, b.operation) for p, b in self._blame.items() if p in self._divergent}
        )
        by = ", ".join(f"version {v} ({op})" for v, op in commits) or "unknown commits"
        undo = ""
        if commits:
            undo = (
                f" To undo it, restore the table to version {commits[0][0] - 1} if the engine "
                "committed nothing since (DeltaTable(uri).restore(...)), or rebuild the store."
            )
        details: dict[str, Any] = {
            "table": table,
            "foreign_commits": [v for v, _ in commits],
            "lost_files": lost,
            "lost_epochs": epochs_of(lost),
            "foreign_files": alien,
        }
        if lost:
            raise StoreLostRowsError(
                f"expected-state table {table!r} lost rows: {len(lost)} file(s) the engine wrote "
                f"({_describe(lost)}) were removed or rewritten by commits the engine did not "
                f"write: {by}. Recovery will not trust this store (read as it is, it would make "
                f"a repair delete healthy sink rows as extra); nothing was written."
                f"{undo}",
                **details,
            )
        raise StoreIntegrityError(
            f"expected-state table {table!r} holds {len(alien)} file(s) the engine did not write "
            f"({', '.join(alien[:_NAMED])}), added by {by}. Recovery will not trust this store; "
            f"nothing was written.{undo}",
            **details,
        )


def _read_commit(fs: pafs.FileSystem, log_dir: str, version: int, uri: str) -> list[dict[str, Any]]:
    path = f"{log_dir}/{version:020d}.json"
    try:
        with fs.open_input_stream(path) as stream:
            text = stream.read().decode()
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise StoreIntegrityError(
            f"expected-state table {uri!r}: commit {version} of its log cannot be read ({exc}); "
            "recovery will not trust this store; nothing was written",
            table=uri,
            version=version,
        ) from exc


def epochs_of(paths: Iterable[str]) -> list[str]:
    """The epochs the named store files hold, as text ("3", "0..4", "base through 9", "?")."""
    out = []
    for path in paths:
        try:
            f = classify(path, path, 0, table="")
        except InvalidInputError:
            out.append("?")  # not a name the store gives its files
            continue
        if f.kind == "base":
            out.append(f"base through {f.epoch}")
        elif f.merged:
            out.append(f"{f.first}..{f.epoch}")
        else:
            out.append(str(f.epoch))
    return out


def _describe(paths: Sequence[str]) -> str:
    epochs = epochs_of(paths)
    named = [f"{p} (epoch {e})" for p, e in zip(paths[:_NAMED], epochs, strict=False)]
    more = f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else ""
    return ", ".join(named) + more


def _footer_bounds(meta: Any, name: str) -> tuple[int, int] | None:
    """A column's min and max over every row group's statistics (None if any lacks them)."""
    index = meta.schema.to_arrow_schema().get_field_index(name)
    if index < 0:
        return None
    low: int | None = None
    high: int | None = None
    for group in range(meta.num_row_groups):
        rows = meta.row_group(group)
        stats = rows.column(index).statistics
        if stats is None:
            return None
        if stats.has_null_count and stats.null_count == rows.num_rows:
            continue  # only NULLs here (tombstones' hashes): no bounds to add
        if not stats.has_min_max:
            return None
        lo, hi = int(stats.min), int(stats.max)
        low = lo if low is None else min(low, lo)
        high = hi if high is None else max(high, hi)
    return None if low is None or high is None else (low, high)


def check_footer(uri: str, file: StoreFile, entry: LogEntry | None) -> str | None:
    """What is wrong with one data file, from its footer against its log entry; None if nothing.

    Reads the file's size and footer only. ``entry`` None: the log entry is not
    known (only the epochs its name promises are checked).
    """
    fs, root = filesystem(uri)
    full = f"{root}/{file.path}"
    try:
        with fs.open_input_file(full) as handle:
            size = handle.size()
            meta = pq.ParquetFile(handle).metadata
    except FileNotFoundError:
        return "is gone"
    except (OSError, ValueError) as exc:  # pyarrow raises ArrowInvalid (a ValueError) on junk
        return f"cannot be read as Parquet ({exc})"
    if entry is not None:
        if entry.deletion_vector:
            return "carries a deletion vector, which the engine never writes"
        if size != entry.size:
            return f"holds {size} bytes where its log entry records {entry.size}"
        if entry.records is not None and meta.num_rows != entry.records:
            return f"holds {meta.num_rows} rows where its log entry records {entry.records}"
    epochs = _footer_bounds(meta, EPOCH_COLUMN)
    if entry is not None and entry.epochs is not None and epochs != entry.epochs:
        return f"holds epochs {epochs} where its log entry records {entry.epochs}"
    if epochs is not None:
        first = file.first if file.kind == "change" else 0
        if epochs[0] < first or epochs[1] > file.epoch:
            return (
                f"holds rows of epochs {epochs[0]}..{epochs[1]}, not of its own "
                f"({first}..{file.epoch})"
            )
    hashes = _footer_bounds(meta, ROW_HASH_COLUMN)
    if entry is not None and entry.hashes is not None and hashes != entry.hashes:
        return "holds other rows than its log entry records (its _row_hash bounds differ)"
    return None


def refuse_files(table: str, problems: Sequence[tuple[str, str]]) -> None:
    """Raise StoreLostRowsError naming files whose footer disagrees with their log entry."""
    if not problems:
        return
    paths = [p for p, _ in problems]
    what = "; ".join(
        f"{p} (epoch {e}) {why}"
        for (p, why), e in zip(problems[:_NAMED], epochs_of(paths), strict=False)
    )
    more = f"; and {len(problems) - _NAMED} more" if len(problems) > _NAMED else ""
    raise StoreLostRowsError(
        f"expected-state table {table!r} lost rows: {len(problems)} data file(s) no longer hold "
        f"what the Delta log records for them: {what}{more}. Recovery will not trust this store "
        "(read as it is, it would make a repair delete healthy sink rows as extra); nothing was "
        "written. Restore those files (a backup), or rebuild the store.",
        table=table,
        lost_files=paths,
        lost_epochs=epochs_of(paths),
    )
