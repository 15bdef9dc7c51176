"""Checking the rebuild log before it is trusted, as the store's tables are checked.

The rebuild log (``expected_state.rebuilds``) decides which logic may write a
pipeline, so a step someone else planted (a "switched" that lets an old-logic
writer start on a half-rebuilt pipeline) or a log someone deleted must be
refused, never believed. Three checks, each naming what it found:

* **its steps are the engine's.** Each step is appended in one commit whose
  Delta app transaction ``<pipeline>#rebuilds`` records the step's number.
  The steps of a pipeline are therefore exactly 0..N, once each, where N is
  the version that app transaction holds: a step beyond N, or a number held
  twice, was not written by the engine (a plain Delta append carries no such
  transaction); a number missing was removed. A step's writer generation
  must be one the pipeline's progress log claimed (its fence): a higher one
  was not written by any writer of the pipeline;
* **its files are as the log describes them.** Each step's file is read
  alone and compared with its log entry: its size, its one row, and the
  statistics the engine wrote for it (a file replaced on disk, its entry
  untouched, is refused);
* **the store's rebases are in it.** A rebase commit of a store table records
  the number of its rebuild's "started" step (the table's app transaction
  ``<pipeline>/<sink>#rebuild``). A store table rebased by a rebuild that the
  log does not hold (the log deleted, or emptied) is refused, naming the table
  and the rebuild: the pipeline is a mix of two logics that nothing names.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from expected_state.delta_files import filesystem
from expected_state.delta_log import transaction_version
from expected_state.fencing import rebuild_app_id
from expected_state.progress_log import StoreProgressLog, progress_fence_id
from expected_state.rebasing import REBUILD_LABEL
from reconcile.core.contract import StoreIntegrityError

__all__ = ["audited_rows", "check_rebases", "steps_app_id"]

# The fields of a step compared with the statistics of its file's log entry.
_CHECKED = ("pipeline", "rebuild", "seq", "generation", "step", "logic_version", "base_epoch")
_RESTORE = (
    "restore the rebuild log from a backup (or DeltaTable(uri).restore(...) to the last version "
    "the engine wrote); nothing was written"
)


def steps_app_id(pipeline: str) -> str:
    """The app transaction whose version is the number of the pipeline's newest step."""
    return f"{pipeline}#rebuilds"


@dataclass(frozen=True)
class _File:
    path: str
    size: int
    stats: dict[str, Any]


def _files(table: DeltaTable) -> list[_File]:
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    return [
        _File(str(a["path"]), int(a.get("size_bytes") or 0),
              {k: v for k, v in a.items() if k.startswith(("min.", "max.", "num_records"))})
        for a in actions
    ]  # fmt: skip


def _refuse(uri: str, problem: str, **details: Any) -> StoreIntegrityError:
    return StoreIntegrityError(
        f"rebuild log {uri!r}: {problem}: no writer or rebuild trusts it; {_RESTORE}",
        table=uri,
        **details,
    )


def _read(uri: str, table: DeltaTable, pipeline: str) -> list[dict[str, Any]]:
    """Every step of ``pipeline`` in the live files, each checked against its log entry."""
    fs, root = filesystem(uri)
    rows: list[dict[str, Any]] = []
    for f in _files(table):
        full = f"{root}/{f.path}"
        actual = fs.get_file_info(full)
        if actual.size is None or actual.size != f.size:
            raise _refuse(uri, f"file {f.path} is not the one its log entry describes (size "
                          f"{actual.size} against {f.size}): it was replaced or removed",
                          file=f.path)  # fmt: skip
        data = pq.read_table(full, filesystem=fs).to_pylist()
        if len(data) != 1 or f.stats.get("num_records") != 1:
            raise _refuse(uri, f"file {f.path} holds {len(data)} rows; the engine writes one "
                          "step per file", file=f.path)  # fmt: skip
        row = data[0]
        for name in _CHECKED:
            low, high = f.stats.get(f"min.{name}"), f.stats.get(f"max.{name}")
            if low != row[name] or high != row[name]:
                raise _refuse(uri, f"file {f.path} says {name} {row[name]!r}, its log entry "
                              f"{low!r}: the file was rewritten", file=f.path)  # fmt: skip
        if row["pipeline"] == pipeline:
            rows.append(row)
    return rows


def _claimed(root: str, pipeline: str) -> int:
    """The newest writer generation the pipeline's progress log claimed (0: none)."""
    try:
        table = DeltaTable(StoreProgressLog(root, pipeline).uri)
    except TableNotFoundError:
        return 0
    return transaction_version(table, progress_fence_id(pipeline)) or 0


def audited_rows(root: str, uri: str, pipeline: str) -> list[dict[str, Any]]:
    """The rows of ``pipeline``'s steps, once each has been checked (see the module's text).

    Raises:
        StoreIntegrityError: a step the engine did not write, a step removed, or
            a file that is not as its log entry says; naming each.
    """
    try:
        table = DeltaTable(uri)
    except TableNotFoundError:
        return []
    rows = _read(uri, table, pipeline)
    newest = transaction_version(table, steps_app_id(pipeline))
    numbers = sorted(int(r["seq"]) for r in rows)
    expected = list(range(newest + 1)) if newest is not None else []
    if numbers != expected:
        planted = [r for r in rows if newest is None or int(r["seq"]) > newest
                   or numbers.count(int(r["seq"])) > 1]  # fmt: skip
        if planted:
            named = ", ".join(_describe(r) for r in planted[:5])
            raise _refuse(uri, f"it holds {len(planted)} step(s) of pipeline {pipeline!r} that "
                          f"the engine did not write ({named}); the engine's steps are 0.."
                          f"{newest if newest is not None else -1}",
                          steps=[int(r["seq"]) for r in planted])  # fmt: skip
        gone = sorted(set(expected) - set(numbers))
        raise _refuse(uri, f"step(s) {gone} of pipeline {pipeline!r} are gone from it (the "
                      f"engine wrote steps 0..{newest})", steps=gone)  # fmt: skip
    claimed = _claimed(root, pipeline)
    beyond = [r for r in rows if int(r["generation"]) > claimed]
    if beyond:
        named = ", ".join(_describe(r) for r in beyond[:5])
        raise _refuse(uri, f"step(s) {named} carry a writer generation that pipeline "
                      f"{pipeline!r} never claimed (its newest: {claimed}): no writer of it "
                      "wrote them", steps=[int(r["seq"]) for r in beyond])  # fmt: skip
    return rows


def _describe(row: Mapping[str, Any]) -> str:
    return (f"step {row['seq']} {row['step']!r} of rebuild {row['rebuild']} to logic "
            f"{row['logic_version']!r}, generation {row['generation']}")  # fmt: skip


def check_rebases(
    root: str, uri: str, pipeline: str, sinks: Iterable[str], rows: list[dict[str, Any]]
) -> None:
    """Refuse a store table that a rebuild rebased which the rebuild log does not hold.

    Args:
        root: the store root.
        uri: the rebuild log's table.
        pipeline: the pipeline.
        sinks: its sink tables in the store.
        rows: its steps, as :func:`audited_rows` read them.

    Raises:
        StoreIntegrityError: naming the table, its rebase commit and the rebuild.
    """
    started = {int(r["seq"]): r for r in rows if r["step"] == "started"}
    for sink in sinks:
        table_uri = f"{root.rstrip('/')}/{pipeline}/{sink}"
        try:
            table = DeltaTable(table_uri)
        except TableNotFoundError:
            continue
        seq = transaction_version(table, rebuild_app_id(pipeline, sink))
        if seq is None or seq in started:
            continue
        commit = _rebase_commit(table)
        raise _refuse(uri, f"store table {table_uri!r} was rebased by a rebuild the log does not "
                      f"hold ({commit}, which began at step {seq} of the log): the log was "
                      "deleted or lost steps, and the pipeline may be a mix of two logics",
                      store_table=table_uri, step=seq)  # fmt: skip


def _rebase_commit(table: DeltaTable) -> str:
    """The newest rebase commit of ``table``, for the message (read only on refusal)."""
    for commit in table.history():
        label = commit.get(REBUILD_LABEL)
        if label:
            logic = commit.get("reconcile.logic_version")
            return (f"its commit {commit.get('version')}: rebuild {label} to logic "
                    f"{json.dumps(logic)}")  # fmt: skip
    return "a rebase commit no longer in its history"
