"""``reconcile status``: a pipeline's progress, read from whichever log the pipeline keeps.

A pipeline keeps its progress log in one of two places, and ``status`` reads both:

- a folder (``--state DIR``): the file log, ``<pipeline>.progress.jsonl``
  (``CommitCycle(..., progress="DIR")``);
- the expected-state store (``--store ROOT``): the store's ``_epochs`` table
  (``CommitCycle(..., expected_state=...)``, and ``reconcile run``).

``--config FILE`` takes the place from the config file: the pipeline's
``progress`` folder if it names one, else its store. Where the store is known
(``--store``, ``--config``), the pipeline's newest rebuild is shown too: an
unfinished one blocks every writer, which ``status`` says, with what to run, and so is the
store's disk use, table by table (``expected_state.disk_use``: live, change, history and
retained files, and the Delta log). Either way ``status`` only reads: it creates no folder,
no table and no generation, and repairs nothing (a torn last line of a file log is reported,
not cut). A place or a pipeline that is not there exits 2 and names what is there.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconcile.core.contract import ConfigurationError

if TYPE_CHECKING:
    from reconcile.core.progress import ProgressState

__all__ = ["add_status_parser", "missing_store", "read_state", "run_status"]


def add_status_parser(commands: Any) -> None:
    status = commands.add_parser(
        "status",
        help="show a pipeline's progress (read-only; creates and repairs nothing)",
        description="Show a pipeline's progress log: a folder's file log (--state), the "
        "expected-state store's (--store), or the one a config file names (--config).",
    )
    where = status.add_mutually_exclusive_group(required=True)
    where.add_argument("--state", type=Path, help="a progress log folder (the file log)")
    where.add_argument(
        "--store", help="an expected-state store's root (its _epochs table is the log)"
    )
    where.add_argument(
        "--config", type=Path, help="a config file: the pipeline's progress folder, or its store"
    )
    status.add_argument(
        "--pipeline", help="the pipeline (with --config, needed only if the file has several)"
    )
    status.add_argument(
        "--pg",
        metavar="DSN",
        help="also show the markers, fences and prepared txns in this database",
    )
    status.add_argument(
        "--older-than",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="flag prepared txns older than this (default 3600)",
    )
    status.add_argument("--json", action="store_true")


def missing_store(root: str) -> str | None:
    """Why a store root is not there (a local path that does not exist), or None.

    Only local paths are checked: an object-store URI is left to the store
    itself, which reports what it cannot read.
    """
    if "://" in root and not root.startswith("file://"):
        return None
    path = Path(root.removeprefix("file://"))
    if path.is_dir():
        return None
    what = "is not a folder" if path.exists() else "does not exist"
    return f"no expected-state store at {root}: the path {what}"


def read_state(state: Path, pipeline: str) -> ProgressState:
    """The pipeline's file progress log, read without creating or repairing anything.

    Raises:
        ConfigurationError: no such folder or log; the message lists the logs
            that the folder does hold (a misspelled --pipeline).
    """
    from reconcile.engine.progress_file import read_progress

    if not state.is_dir():
        raise ConfigurationError(
            f"no progress log folder {state}: check --state (nothing was created)"
        )
    try:
        return read_progress(state, pipeline)
    except ConfigurationError as exc:
        held = sorted(
            p.name.removesuffix(".progress.jsonl") for p in state.glob("*.progress.jsonl")
        )
        raise ConfigurationError(
            f"{exc}: check --pipeline (logs in that folder: {held or 'none'}); nothing was created"
        ) from None


def _read_store(root: str, pipeline: str) -> ProgressState:
    """The pipeline's progress log in the store at ``root``, read without writing."""
    from expected_state.progress_log import read_store_progress
    from reconcile.core.contract import validate_name

    missing = missing_store(root)
    if missing is not None:
        raise ConfigurationError(f"{missing}: check --store (nothing was created)")
    validate_name("pipeline", pipeline)
    try:
        return read_store_progress(root, pipeline)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{exc}: check --pipeline; nothing was created") from None


@dataclass(frozen=True)
class _Log:
    """Where a pipeline's progress log is: ``kind`` "file" (a folder) or "store" (a root)."""

    pipeline: str
    kind: str
    place: str
    store: str | None = None  # the store root, where the rebuild log is (None: not known)

    def read(self) -> ProgressState:
        if self.kind == "file":
            return read_state(Path(self.place), self.pipeline)
        return _read_store(self.place, self.pipeline)


def _locate(args: argparse.Namespace) -> _Log:
    """The log that ``--state``, ``--store`` or ``--config`` (with ``--pipeline``) names."""
    if args.config is None:
        if not args.pipeline:
            flag = "--state" if args.state is not None else "--store"
            raise ConfigurationError(f"reconcile status: {flag} needs --pipeline")
        if args.state is not None:
            return _Log(args.pipeline, "file", str(args.state))
        return _Log(args.pipeline, "store", str(args.store), str(args.store))
    from reconcile.cli.config import load_config

    config = load_config(args.config)
    if args.pipeline:
        pipeline = config.pipeline(args.pipeline)
    elif len(config.pipelines) == 1:
        (pipeline,) = config.pipelines
    else:
        raise ConfigurationError(
            f"{config.path} has several pipelines: name one with --pipeline "
            f"({[p.name for p in config.pipelines]})"
        )
    if pipeline.progress is not None:
        return _Log(pipeline.name, "file", str(pipeline.progress), pipeline.store)
    return _Log(pipeline.name, "store", pipeline.store, pipeline.store)


def run_status(args: argparse.Namespace) -> int:
    """``reconcile status``: print the log's state (and, with ``--pg``, the database's)."""
    from reconcile.core.progress import EpochStatus

    where = _locate(args)
    progress = where.read()
    summary: dict[str, Any] = {
        "pipeline": where.pipeline,
        "progress_log": where.kind,
        "at": where.place,
        "log_id": progress.log_id,
        "generation": progress.generation,
        "last_committed": progress.last_committed,
        "truncated_below": progress.horizon,
        **{s.value: progress.epochs_in(s) for s in EpochStatus if s is not EpochStatus.UNKNOWN},
    }
    if where.store is not None:
        summary["rebuild"] = _rebuild_state(where.store, where.pipeline)
        summary["disk"] = _disk_state(where.store, where.pipeline)
    torn = False
    if where.kind == "file":
        log_file = Path(where.place) / f"{where.pipeline}.progress.jsonl"
        torn = not log_file.read_bytes().endswith(b"\n") and log_file.stat().st_size > 0
        summary["torn_tail"] = torn
    if args.pg:
        from sinks.postgres.admin import database_status

        summary["postgres"] = database_status(
            args.pg, where.pipeline, progress, older_than_s=args.older_than
        )
    if args.json:
        print(json.dumps(summary))
        return 0
    for key, value in summary.items():
        if key not in ("postgres", "rebuild", "disk"):
            print(f"{key}: {value}")
    if summary.get("rebuild") is not None:
        print(_rebuild_line(summary["rebuild"]))
    if "disk" in summary:
        _print_disk(summary["disk"])
    if torn:
        print("note: the log's last line is torn (a crash mid-write); it was ignored, not repaired")
    if "postgres" in summary:
        _print_database(summary["postgres"])
    return 0


def _rebuild_state(root: str, pipeline: str) -> dict[str, Any] | None:
    """The pipeline's newest rebuild step, as status shows it (None: never rebuilt)."""
    from expected_state.rebuilds import RebuildLog

    newest = RebuildLog(root, pipeline).newest()
    if newest is None:
        return None
    return {
        "rebuild": newest.rebuild,
        "step": newest.step,
        "finished": newest.finished,
        "logic_version": newest.logic_version,
        "previous": newest.previous,
        "logic_in_force": newest.logic_in_force,
        "base_epoch": newest.base_epoch,
        "generation": newest.generation,
        "describe": newest.describe(),
    }


def _disk_state(root: str, pipeline: str) -> dict[str, Any]:
    """The store's disk use, in bytes: each of the pipeline's tables, their total, ``_epochs``."""
    from deltalake.exceptions import DeltaError

    from expected_state.disk_use import DiskUse, pipeline_disk_use, table_disk_use

    try:
        tables = pipeline_disk_use(root, pipeline)
        epochs = table_disk_use(f"{root.rstrip('/')}/_epochs", store_layout=False)
    except (OSError, DeltaError) as exc:
        # A status that cannot read the store's tables (an object store refusing the
        # listing) still shows the progress it read: the disk use says why not.
        return {"error": f"not shown: the store's log or files cannot be read ({exc})"}
    total = sum(tables.values(), DiskUse())
    return {
        "tables": {sink: use.as_dict() for sink, use in tables.items()},
        "total": total.as_dict(),
        "epochs_table": epochs.as_dict() if epochs is not None else None,
    }


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def _disk_line(name: str, use: dict[str, int]) -> str:
    figures = ", ".join(
        f"{k} {_mb(use[k])}" for k in ("live", "change", "history", "retained", "log")
    )
    return f"  {name}: {_mb(use['total'])} ({figures})"


def _print_disk(disk: dict[str, Any]) -> None:
    if "error" in disk:
        print(f"disk: {disk['error']}")
        return
    print("disk (live: base and merged files; change: files of single epochs; history: kept for "
          "older versions; retained: kept only until vacuum's retention passes):")  # fmt: skip
    for sink, use in disk["tables"].items():
        print(_disk_line(sink, use))
    print(_disk_line("total", disk["total"]))
    if disk["epochs_table"] is not None:
        print(_disk_line("_epochs (the store's, shared by its pipelines)", disk["epochs_table"]))


def _rebuild_line(rebuild: dict[str, Any]) -> str:
    """The newest rebuild in one line: an unfinished one blocks every writer, and says so."""
    if not rebuild["finished"]:
        return (
            f"rebuild: UNFINISHED: {rebuild['describe']}. No writer of the pipeline can start "
            "until it is finished (reconcile rebuild --apply, run again) or undone (reconcile "
            "rebuild --rollback)"
        )
    return f"rebuild: {rebuild['describe']}; the logic in force is {rebuild['logic_in_force']!r}"


def _print_database(found: dict[str, Any]) -> None:
    print(f"postgres: {found['database']}")
    for schema in found["schemas"]:
        print(f"  {schema['schema']}.reconcile_commits:")
        for m in schema["markers"]:
            whose = "this log" if m["this_log"] else f"ANOTHER log {m['log_id']!r}"
            print(
                f"    sink {m['sink']}: {m['markers']} markers, epochs {m['epochs'][0]}.."
                f"{m['epochs'][1]} into {m['target']} by {whose} (generation <= "
                f"{m['generation']}, last at {m['last_committed_at']})"
            )
        for f in schema["fences"]:
            whose = "this log" if f["this_log"] else f"ANOTHER log {f['log_id']!r}"
            print(f"    fence {f['sink']}: generation {f['generation']}, {whose}")
    if not found["prepared"]:
        print("  prepared transactions: none")
    for p in found["prepared"]:
        old = "  OLD" if p["older_than_threshold"] else ""
        print(
            f"  prepared {p['gid']}: {p['age_s']}s old, owner {p['owner']}, epoch "
            f"{p['epoch_status']}{old}"
        )
