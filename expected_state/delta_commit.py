"""Commit already-written Parquet files to a Delta table in one idempotent, fenced Delta commit."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.fs as pafs  # type: ignore[import-untyped, unused-ignore]
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import RemoveAction

from expected_state.delta_files import (
    DataFile,
    check_file_schema,
    delta_stats,
    describe_data_file,
    filesystem,
    write_data_file,
)
from expected_state.delta_log import transaction_version
from expected_state.protocol import create_config
from expected_state.refusals import store_refusal
from reconcile.core import hooks
from reconcile.core.contract import (
    FencedError,
    InvalidInputError,
    OutcomeUnknownError,
    RetryableError,
)
from reconcile.core.durable import fsync_path

__all__ = [
    "BEFORE_WRITE",
    "DEFAULT_COMMIT_RETRIES",
    "BasedOn",
    "CommitResult",
    "DataFile",
    "DeltaCommit",
    "check_fence",
    "check_file_schema",
    "commit_files",
    "delta_stats",
    "describe_data_file",
    "make_durable",
    "recorded_version",
    "table_exists",
    "write_data_file",
]

# The last moment before the log write: every check is done on the snapshot the
# commit is based on; a commit that lands from here on must make this one fail.
BEFORE_WRITE = hooks.declare("delta.commit_files.before_write")

# delta-rs rebases a commit that lost the race for a log version and retries
# it after its own conflict check (which also rejects a concurrent commit of
# the same app transaction). Unbounded retries would hide a hot table, so the
# number is fixed; past it the caller gets a RetryableError (nothing written).
DEFAULT_COMMIT_RETRIES = 8


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What :func:`commit_files` did.

    Attributes:
        committed: True if this call made the commit; False if the token was already recorded.
        table_version: the Delta version that holds the token (None if unknown, e.g. a no-op
            whose commit has been cleaned from the log).
    """

    committed: bool
    table_version: int | None


def table_exists(table_uri: str) -> bool:
    """True if a Delta table exists at ``table_uri``."""
    return DeltaTable.is_deltatable(table_uri)


def recorded_version(table_uri: str, app_id: str) -> int | None:
    """The newest version recorded for ``app_id`` in the table's log (None if none or no table)."""
    try:
        return transaction_version(DeltaTable(table_uri), app_id)
    except TableNotFoundError:
        return None


def _open_or_create(table_uri: str, schema: pa.Schema, partition_by: Sequence[str]) -> DeltaTable:
    """Open the table, creating it empty (version 0) if it does not exist yet.

    ``mode="ignore"`` makes creation idempotent and safe against a concurrent
    creator: whoever loses the race simply opens the winner's table. The
    returned snapshot is new: whatever a caller read before it is stale.
    """
    try:
        return DeltaTable(table_uri)
    except TableNotFoundError:
        DeltaTable.create(
            table_uri,
            schema,
            mode="ignore",
            partition_by=list(partition_by) or None,
            configuration=create_config(schema),
        )
        make_durable(table_uri, 0, 0)
        return DeltaTable(table_uri)


def check_fence(table: DeltaTable, fence: tuple[str, int], *, table_name: str) -> None:
    """Reject a writer whose generation is below the one recorded in ``table``'s snapshot.

    Raises:
        FencedError: naming the table, both generations, and that nothing was written.
    """
    fence_id, generation = fence
    recorded = transaction_version(table, fence_id)
    if recorded is not None and recorded > generation:
        raise FencedError(
            f"table {table_name!r}: writer generation {generation} is fenced off by generation "
            f"{recorded}, which has taken over; nothing was written",
            table=table_name,
            generation=generation,
            recorded_generation=recorded,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeltaCommit:
    """One Delta commit, described before it is made: its files, its token, its fence.

    Attributes:
        table_uri: the Delta table's root (path or URI).
        schema: the table's Arrow schema (used to create it and to check files).
        app_id: the idempotency token's application id.
        version: the idempotency token's version (an epoch), >= 0 (-1 only for
            a commit whose replay check is the caller's, see :class:`BasedOn`).
        add: Parquet files already written under the root.
        remove: files of the current snapshot to remove in the same commit.
        fence: ``(fence app id, generation)`` of the writer: checked on the commit's
            snapshot (FencedError if a newer generation is recorded) and recorded in
            the commit. Two commits carrying the same app id conflict in delta-rs, so
            the shared fence token also serialises one writer's read-modify-write commits.
        custom_metadata: extra commitInfo fields (JSON-serialisable).
        tokens: more ``(app id, version)`` app transactions recorded in the same commit
            (a rebase's rebuild step).
        data_change: the Delta ``dataChange`` flag of every add and remove; False for
            a commit that rearranges rows without changing what they mean.
        partition_by: partition columns, for a table created here.
        check_schema: read each added file's footer and compare it to ``schema``.
        max_retries: bound on delta-rs' conflict retries.
        table_name: how errors name the table (default: the URI).
    """

    table_uri: str
    schema: pa.Schema
    app_id: str
    version: int
    add: Sequence[DataFile] = ()
    remove: Sequence[DataFile] = ()
    fence: tuple[str, int] | None = None
    custom_metadata: Mapping[str, Any] | None = None
    tokens: Sequence[tuple[str, int]] = ()
    data_change: bool = True
    partition_by: Sequence[str] = ()
    check_schema: bool = True
    max_retries: int = DEFAULT_COMMIT_RETRIES
    table_name: str | None = None

    @property
    def name(self) -> str:
        """The table as errors name it."""
        return self.table_name or self.table_uri


@dataclass(frozen=True, slots=True)
class BasedOn:
    """The snapshot a commit is based on, and how the caller checked its replay on it.

    The snapshot is the one the caller made its own checks on: delta-rs' conflict
    check then rejects the commit if anything that matters landed after it. It is
    not necessarily brought up to date after the commit: refresh it
    (``update_incremental``) before reusing it.

    The replay check (is this commit's token recorded already?) is one of three:

    * neither field set: :func:`commit_files` reads ``transaction_version(app_id)``
      on ``table``;
    * ``token_checked``: the caller has just read it from ``table`` and found it
      below the commit's version, so it is not read again;
    * ``landed``: for a commit whose token alone cannot say whether it landed (a
      token moved back by a revert, a fence-only commit such as a compaction or a
      blind append of status rows): the caller made its own replay check on
      ``table``, and after a failed commit ``landed()`` (reading the log afresh)
      says whether this commit is in. It allows version -1 (a token moved back
      before the first epoch).

    Attributes:
        table: the snapshot.
        token_checked: the token was read from ``table`` by the caller.
        landed: the caller's own check that the commit is in.
    """

    table: DeltaTable
    token_checked: bool = False
    landed: Callable[[], bool] | None = None


def commit_files(commit: DeltaCommit, based_on: BasedOn | None = None) -> CommitResult:
    """Make ``commit``: add its files (and remove its ``remove``) in ONE Delta commit.

    Every check is made on the snapshot the commit is based on, never on
    another one: the token (delta-rs does not reject a replayed app
    transaction), and the writer's fence. The fence generation is recorded
    in the same commit, so a takeover that commits after that snapshot carries
    the same app id and makes delta-rs' conflict check fail this commit: a
    stale writer can neither write after a takeover nor lower the fence. The
    table is created (empty, version 0) if it does not exist.

    deltalake does not fsync what it writes (it links a temp file into
    ``_delta_log`` and returns); the commit file and the log folder are
    fsynced here before this returns, so a recorded epoch survives a power loss.

    Args:
        commit: what to commit (see :class:`DeltaCommit`).
        based_on: the snapshot to base the commit on, and how its replay was
            checked (see :class:`BasedOn`); None opens (or creates) the table here
            and reads the token on that new snapshot.

    Returns:
        Whether this call committed, and the table version holding the token.

    Raises:
        InvalidInputError: a file's schema does not match; nothing was written.
        FencedError: a newer writer generation holds the table; nothing was written.
        RetryableError: the commit lost to concurrent writers more than
            ``max_retries`` times; nothing was written.
        OutcomeUnknownError: the commit failed in a way that may have left it
            recorded, and re-reading the log to find out failed too.
    """
    name, version, fence = commit.name, commit.version, commit.fence
    landed = None if based_on is None else based_on.landed
    lowest = -1 if landed is not None else 0
    if isinstance(version, bool) or not isinstance(version, int) or version < lowest:
        raise InvalidInputError(
            f"table {name!r}: commit token version must be an int >= 0, got {version!r}; "
            "nothing was written",
            table=name,
            value=repr(version),
        )
    if commit.check_schema and commit.add:
        check_file_schema(commit.table_uri, commit.add, commit.schema, table=name)
    if based_on is None:
        table = _open_or_create(commit.table_uri, commit.schema, commit.partition_by)
        token_checked = False
    else:
        table = based_on.table
        token_checked = based_on.token_checked or landed is not None
    if fence is not None:
        check_fence(table, fence, table_name=name)
    already = None if token_checked else transaction_version(table, commit.app_id)
    if already is not None and already >= version:
        # Replay of a recorded (or superseded) token: the files of this attempt
        # are orphans that vacuum removes; committing them would duplicate rows.
        return CommitResult(committed=False, table_version=None)
    base = table.version()
    hooks.point(BEFORE_WRITE)
    # The log entry is created put-if-absent: a local file linked into place, or
    # on S3 a PutObject with If-None-Match: * (delta-rs 1.x, no lock, no unsafe
    # mode): of two writers racing for a version one wins; the loser lands below.
    try:
        table.create_write_transaction(
            _actions(commit),
            mode="append",
            schema=commit.schema,
            partition_by=list(commit.partition_by) or None,
            commit_properties=_properties(commit),
        )
    except Exception as exc:
        # delta-rs raises a schema it refuses as a plain Exception, checked
        # before the log is written: nothing was, and no retry would be taken.
        refused = store_refusal(exc, table=name, what=f"the commit of token {version}")
        if refused is not None:
            raise refused from None
        if not isinstance(exc, CommitFailedError | DeltaError | OSError):
            raise
        return _resolve_failed_commit(commit, exc, landed)
    version = _committed_version(table, commit.table_uri, base)
    make_durable(commit.table_uri, base + 1, version)
    return CommitResult(committed=True, table_version=version)


def _actions(commit: DeltaCommit) -> list[Any]:
    """The commit's add and remove actions."""
    now = int(time.time() * 1000)
    actions: list[Any] = [f.to_add_action(data_change=commit.data_change) for f in commit.add]
    actions += [
        RemoveAction(
            path=f.path,
            data_change=commit.data_change,
            deletion_timestamp=now,
            size=f.size,
            partition_values=dict(f.partition_values),
        )
        for f in commit.remove
    ]
    return actions


def _properties(commit: DeltaCommit) -> CommitProperties:
    """The commitInfo fields and the app transactions: the token, and the fence."""
    app_id, version, fence = commit.app_id, commit.version, commit.fence
    metadata = {"reconcile.app_id": app_id, "reconcile.version": version}
    metadata.update(commit.custom_metadata or {})
    tokens = [Transaction(app_id=app_id, version=version)]
    if fence is not None and fence[0] != app_id:
        tokens.append(Transaction(app_id=fence[0], version=fence[1]))
    tokens.extend(Transaction(app_id=extra, version=v) for extra, v in commit.tokens)
    return CommitProperties(
        custom_metadata=metadata, max_commit_retries=commit.max_retries, app_transactions=tokens
    )


def _committed_version(table: DeltaTable, table_uri: str, base: int) -> int:
    """The version a commit based on version ``base`` landed at.

    Reloading the table costs a listing of the whole log folder; on a local
    table, if ``base + 1`` exists and ``base + 2`` does not, the commit can only
    be ``base + 1`` (delta-rs moves a commit that lost a version to a later one),
    so two ``stat`` calls answer. Otherwise (a concurrent commit, an object
    store) the table is reloaded, and ``table`` is then up to date.
    """
    fs, root = filesystem(table_uri)
    if isinstance(fs, pafs.LocalFileSystem):
        log_dir = Path(root) / "_delta_log"
        if (log_dir / f"{base + 1:020d}.json").exists() and not (
            log_dir / f"{base + 2:020d}.json"
        ).exists():
            return base + 1
    table.update_incremental()
    return table.version()


def make_durable(table_uri: str, first: int, last: int) -> None:
    """fsync the commit files ``first..last`` (and their checkpoints) and the log folder.

    Only local tables need it (an object store's PUT is durable when it
    returns). Missing files are skipped: a commit file older than ``first``
    could have been cleaned up, and checkpoints exist only every few versions.
    """
    fs, root = filesystem(table_uri)
    if not isinstance(fs, pafs.LocalFileSystem):
        return
    log_dir = Path(root) / "_delta_log"
    names = [f"{v:020d}.json" for v in range(first, last + 1)]
    checkpoints = [f"{v:020d}.checkpoint.parquet" for v in range(first, last + 1)]
    names += [c for c in checkpoints if (log_dir / c).exists()]
    if len(names) > last + 1 - first:
        names.append("_last_checkpoint")  # rewritten only with a checkpoint
    for name in names:
        path = log_dir / name
        if path.exists():
            fsync_path(path)
    fsync_path(log_dir)
    fsync_path(root)


def _resolve_failed_commit(
    commit: DeltaCommit, exc: Exception, landed: Callable[[], bool] | None
) -> CommitResult:
    """Decide what a failed commit means by re-reading the log, never by guessing.

    Cases:
      * the token is now recorded (or, for a commit the token cannot identify,
        the caller's ``landed()`` says so): a concurrent writer (or our own
        attempt, if the failure came after the log write) committed it, so the
        epoch is in and this is the idempotent no-op;
      * a newer writer generation is recorded: we were fenced while committing
        (the takeover's commit conflicted with ours); nothing of ours was written;
      * the token is not recorded and the failure is a lost race: nothing
        was written, the caller may retry (RetryableError);
      * any other failure with the token absent: a Delta log entry is written by
        one atomic put-if-absent, so absent means not written (RetryableError);
      * the log cannot be re-read: we cannot tell (OutcomeUnknownError).
    """
    name, app_id, version, fence = commit.name, commit.app_id, commit.version, commit.fence
    try:
        fresh = DeltaTable(commit.table_uri)
        now = transaction_version(fresh, app_id)
        done = landed() if landed is not None else now is not None and now >= version
    except Exception as reread:  # any failure to re-read means "unknown"
        raise OutcomeUnknownError(
            f"table {name!r}: commit of token ({app_id!r}, {version}) failed ({exc}) and the "
            f"log could not be re-read ({reread}); whether it was written is unknown",
            table=name,
            app_id=app_id,
            version=version,
        ) from exc
    if done:
        return CommitResult(committed=False, table_version=None)
    if fence is not None:
        check_fence(fresh, fence, table_name=name)
    reason = "lost to concurrent writers" if isinstance(exc, CommitFailedError) else "failed"
    raise RetryableError(
        f"table {name!r}: commit of token ({app_id!r}, {version}) {reason}: {exc}; "
        "nothing was written",
        table=name,
        app_id=app_id,
        version=version,
    ) from exc
