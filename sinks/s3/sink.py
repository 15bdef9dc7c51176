"""The file sink on S3 object storage: prepare PUTs a batch object, commit appends a log entry.

The batches are the local file sink's (``sinks.files``): one JSON-lines object
per epoch whose first line is a header (txn id, epoch, row count, the writer's
progress log id). What differs is how a batch becomes visible: there is no
rename on an object store, so the commit point is the conditional put of an
entry in the sink's commit log (``sinks.s3.log``), which also carries the fence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from reconcile.core.claims import Claim
from reconcile.core.contract import (
    OK,
    Fatal,
    FatalError,
    FencedError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
    TxnIdParseError,
)
from reconcile.core.sink import SinkCapabilities
from sinks.files.layout import MAX_HEADER, BatchStaging, parse_header
from sinks.ownership import describe_log, foreign_commit, foreign_prepare
from sinks.s3.log import CommitEntry, CommitLog, LogState
from sinks.s3.objects import Bucket, S3Location, parse_s3_uri

__all__ = ["S3FileSink", "open_uri", "pullable_sink"]

_SUFFIX = ".batch"
_BATCHES = "batches/"


class S3FileSink(BatchStaging):
    """A TwoPhaseSink that writes one JSON-lines batch object per epoch to S3.

    Layout under ``s3://bucket/prefix/<sink name>/``:

    - ``batches/<txn>.batch``: a prepared batch, written whole by one PUT
      (durable when the PUT returns, invisible until a commit entry names it);
    - ``log/<seq>.json``: the commit log (see ``sinks.s3.log``). A ``commit``
      entry makes its epoch's batch visible; a ``fence`` entry raises a
      pipeline's writer generation. Each entry is created with
      ``If-None-Match: *``: exactly one writer wins each seq.

    Readers fold the log and read the batches its commit entries name; a batch
    no entry names is not in the sink. Committed batches stay where prepare
    put them (a copy would be a second, non-atomic step).

    ``bind(writer)`` records the writer's log id in each batch header and
    commit entry; an epoch found committed by another log is a Fatal
    MarkerMismatchError, never OK.
    """

    capabilities = SinkCapabilities(durable_prepare=True)

    def __init__(self, name: str, root: S3Location) -> None:
        BatchStaging.__init__(self, name, "file sink {name} on S3")
        self.location = root.child(name)
        self.bucket = Bucket(self.location)
        self.log = CommitLog(self.bucket)
        # The rows' key, for pull-and-diff (a sink that only writes needs none).
        self.key: list[str] | None = None

    def prepare(self, txn_id: SinkTxnId) -> SinkOutcome:
        try:
            raised = self._raise_fence(txn_id)
            if raised is not None:
                return raised
            done = self._already_committed(self.log.state, txn_id, "prepare")
            if done is not None:
                return done  # OK: this log's epoch is already in the sink
            rows = self._staged.get(txn_id)
            if rows is None:
                # Staged rows died with the process that staged them.
                return Retryable(f"{txn_id}: nothing staged in this process")
            header = {
                "txn": str(txn_id),
                "epoch": txn_id.epoch,
                "rows": len(rows),
                "log_id": self._binding.log_id,
            }
            body = b"".join([json.dumps(header).encode() + b"\n", *(r + b"\n" for r in rows)])
            # One PUT: the object appears whole or not at all, and is durable
            # when the call returns. The key carries the generation, so no other
            # writer writes it; a retried prepare replaces it with the same bytes.
            self.bucket.put(self._batch(txn_id), body)
        except RetryableError as exc:
            return Retryable.of(exc)
        except FatalError as exc:
            return Fatal.of(exc)
        del self._staged[txn_id]
        return OK

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        try:
            return self._commit(txn_id)
        except RetryableError as exc:
            # The entry's PUT may or may not have landed: the retry reads the
            # log first, and finds the epoch committed (OK) or appends it once.
            return Retryable.of(exc)
        except FatalError as exc:
            return Fatal.of(exc)

    def abort(self, txn_id: SinkTxnId) -> SinkOutcome:
        self._staged.pop(txn_id, None)
        try:
            state = self.log.refresh()
            if txn_id.key in state.committed:
                return Fatal(f"{txn_id}: abort of a committed batch; committed data stays")
            # The key carries the generation, so this removes only this
            # writer's batch: a stale writer cannot discard a newer writer's.
            # A commit entry could still name it after this check only if this
            # txn's own commit ran concurrently with its abort, which the
            # cycle never does.
            self.bucket.delete(self._batch(txn_id))
        except RetryableError as exc:
            return Retryable.of(exc)
        except FatalError as exc:
            return Fatal.of(exc)
        return OK

    def recover(self) -> Sequence[SinkTxnId]:
        state = self.log.refresh()
        stranded = []
        for relative in self.bucket.list(_BATCHES):
            try:
                txn = SinkTxnId.from_string(relative.removeprefix(_BATCHES).removesuffix(_SUFFIX))
            except TxnIdParseError:
                continue  # not ours
            entry = state.committed.get(txn.key)
            if entry is None or entry.txn != str(txn):
                stranded.append(txn)  # prepared, not the batch its epoch committed
        return sorted(stranded)

    def recovery_target(
        self,
        pipeline: str,
        generation: int | None,
        *,
        write: bool,
        key: Sequence[str] | None = None,
    ) -> Any:
        """This sink's rows as a pull-and-diff target (``reconcile.recovery``), keyed by ``key``."""
        from sinks.s3.recovery import S3RecoveryTarget

        return S3RecoveryTarget(self, pipeline, generation, key if key is not None else self.key)

    def close(self) -> None:
        """Forget staged rows (the S3 client is shared by the process)."""
        self._staged.clear()

    # ------------------------------------------------------------ internals

    def _batch(self, txn_id: SinkTxnId) -> str:
        return f"{_BATCHES}{txn_id}{_SUFFIX}"

    def _commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        """Make ``txn_id``'s batch visible, deciding from the log as it is now.

        Cases, in order:
          * the epoch is committed by this progress log: OK (a lost reply, a
            retry); a stale generation's batch of it is a leftover, removed;
          * committed by another log: Fatal (MarkerMismatchError), never OK;
          * this generation is fenced: Fatal (FencedError);
          * no prepared batch, an unreadable one, or one another log prepared:
            Fatal, naming it;
          * else the commit entry is appended; a lost race re-reads the log and
            decides again from the top two cases and the fence.
        """
        state = self.log.refresh()
        done = self._already_committed(state, txn_id, "commit")
        if done is not None:
            found = state.committed.get(txn_id.key)
            if done and (found is None or found.txn != str(txn_id)):
                # Committed before by another generation of this log (or stood
                # for by a repair): this txn's prepared batch is a stale
                # leftover that no entry names.
                self.bucket.delete(self._batch(txn_id))
            return done
        fenced = self._fenced(state, txn_id)
        if fenced is not None:
            return fenced
        source = self._batch(txn_id)
        try:
            head = self.bucket.get(source, first_bytes=MAX_HEADER + 1)
            if head is None:
                return Fatal(f"{txn_id}: commit of a batch that was never prepared")
            header = parse_header(head, self.bucket.uri(source))
        except ValueError as exc:
            return Fatal.of(FatalError(f"{txn_id}: prepared batch is unreadable: {exc}"))
        owner = header.get("log_id")
        if owner != self._binding.log_id:
            return foreign_prepare(
                f"file sink {self._name!r}",
                txn_id,
                found_log=owner,
                log_id=self._binding.log_id,
                location=self.bucket.uri(source),
            )
        entry = {
            "kind": "commit",
            "pipeline": txn_id.pipeline,
            "sink": txn_id.sink,
            "epoch": txn_id.epoch,
            "txn": str(txn_id),
            "rows": int(header.get("rows", 0)),
            "log_id": self._binding.log_id,
            "batch": source,
        }

        def check(state: LogState) -> SinkOutcome | None:
            # Checked on the state the entry follows; the put succeeds only if
            # nothing was appended since, so a takeover in between is seen here
            # on the next attempt, never missed.
            fenced = self._fenced(state, txn_id)
            if fenced is not None:
                return fenced
            return self._already_committed(state, txn_id, "commit")

        # THE commit point: the epoch is visible once this entry's PUT returns.
        stop = self.log.append(entry, check)
        return OK if stop is None else stop

    def _raise_fence(self, txn_id: SinkTxnId) -> SinkOutcome | None:
        """Fatal if ``txn_id``'s generation is stale; raise the fence if it is newer."""
        entry = {
            "kind": "fence",
            "pipeline": txn_id.pipeline,
            "generation": txn_id.generation,
            "log_id": self._binding.log_id,
        }

        def check(state: LogState) -> SinkOutcome | None:
            fenced = self._fenced(state, txn_id)
            if fenced is not None:
                return fenced
            if txn_id.generation == state.fences.generation(txn_id.pipeline).generation:
                return OK  # already the fence: nothing to append
            return None

        stop = self.log.append(entry, check)
        return None if stop is None or stop else stop

    def _fenced(self, state: LogState, txn_id: SinkTxnId) -> SinkOutcome | None:
        newest = state.fences.generation(txn_id.pipeline)
        if txn_id.generation >= newest.generation:
            return None
        mine = self._binding.log_id
        if newest.log_id == mine:
            # A fence of this log newer than any generation the store granted
            # is no writer's: refused as untrusted, not obeyed as a takeover.
            claim = Claim(self._name, f"file sink {self._name!r} on S3",
                          f"the fence in {self.bucket.uri('log/')}", "fence", None,
                          generation=newest.generation)  # fmt: skip
            if (untrusted := self._binding.untrusted(claim)) is not None:
                return untrusted
        detail = ""
        if newest.log_id != mine:
            # Generations of two progress logs are unrelated numbers: say so, or
            # a fresh state meeting an old run's fence would look like a zombie.
            detail = (
                f" (the fence was set by {describe_log(newest.log_id)}; this writer has "
                f"{describe_log(mine)}: another state writes under the same pipeline and "
                "sink names)"
            )
        return Fatal.of(
            FencedError(
                f"{txn_id}: fenced, generation {newest.generation} has taken over{detail}",
                generation=txn_id.generation,
                fence=newest.generation,
            )
        )

    def _already_committed(
        self, state: LogState, txn_id: SinkTxnId, where: str
    ) -> SinkOutcome | None:
        """None if the epoch is not committed; OK if this log committed it; else Fatal.

        An epoch a repair stands for is committed: the repair brought the sink
        to it, and a replay's rows folded after the repair's would undo it.
        """
        what = f"file sink {self._name!r} on S3"
        entry: CommitEntry | None = state.committed.get(txn_id.key)
        if entry is not None:
            found_txn, found_log, seq = entry.txn, entry.log_id, entry.seq
            where = self.bucket.uri(f"log/{seq:020d}.json")
            claim = entry.claim(self._name, what, where, txn_id.epoch)
        else:
            repair = state.covering(*txn_id.key)
            if repair is None:
                return None
            found_txn, found_log, seq = f"repair {repair.repair_id}", repair.log_id, repair.seq
            claim = repair.claim(self._name, what, self.bucket.uri(f"log/{seq:020d}.json"))
        if found_log == self._binding.log_id:
            # This log's record: believed only as far as the store decided.
            untrusted = self._binding.untrusted(claim)
            return OK if untrusted is None else untrusted
        return foreign_commit(
            f"file sink {self._name!r}",
            txn_id,
            where,
            found_txn=found_txn,
            found_log=found_log,
            log_id=self._binding.log_id,
            location=self.bucket.uri(f"log/{seq:020d}.json"),
            advice=(
                "to write this pipeline's epochs again, give this pipeline another sink "
                f"prefix than {self.location.uri()}."
            ),
        )


def pullable_sink(
    dsn: str,
    table: str,
    *,
    name: str,
    schema: str | None = None,
    key: Sequence[str] | None = None,
) -> S3FileSink:
    """The sink recovery pulls from: ``name``'s objects under ``dsn`` (``s3://bucket/prefix``).

    What ``reconcile verify|repair|watch`` gets from the registry. A file sink
    has no tables: its folder is the sink's name, and ``table`` and
    ``schema`` name nothing in it; ``key`` is the rows' key.
    """
    sink = open_uri(name, dsn)
    sink.key = None if key is None else list(key)
    return sink


def open_uri(name: str, uri: str) -> S3FileSink:
    """The sink of ``s3://bucket/prefix``: its objects under ``prefix/<name>/``.

    Raises:
        ConfigurationError: the URI is not ``s3://bucket/prefix``, or carries credentials.
    """
    return S3FileSink(name, parse_s3_uri(name, uri))
