"""The S3 file sink's commit log: numbered entries, each written once by a conditional put.

Object stores have no atomic rename and no lock, so the local file sink's
"flock, check the fence, rename into committed/" cannot be copied. What S3
does give is an atomic create: ``PutObject`` with ``If-None-Match: *`` writes
the key only if no object has it, and of two writers racing for one key
exactly one gets 200 and the other 412. The log is built on that, as Delta's
own log is:

- entry ``log/<seq>.json`` (``seq`` zero-padded, so listing is in order) is
  one JSON object: a ``commit`` (an epoch's batch made visible: its txn id,
  row count, the writer's progress log id, the batch's key), a ``fence`` (a
  pipeline's newest writer generation) or a ``repair`` (a batch of upserts and
  deletes that ``reconcile repair`` wrote, and the epochs it stands for);
- a writer reads the log up to its end, checks what it is about to do against
  the state the entries fold into (the fence, the epoch not committed yet),
  then puts entry ``end + 1`` with ``If-None-Match: *``. The put succeeds only
  if nothing was appended since the read, so the check and the write are one
  atomic step: a takeover's fence entry or another writer's commit makes the
  put fail with 412, and the writer reads the new entries and checks again.

So an epoch becomes visible exactly when its commit entry's PUT returns 200,
all of it at once; a zombie can never append after a newer generation's fence
entry; and each seq has exactly one winner. The fold also keeps only the first
commit entry of an epoch (defensive: the check already refuses a second one).

Whoever can write the bucket can put entries too. So the log is read with
three limits: entries are read in sequence and never past a missing one (a
removed entry could hide a fence); each entry is read with a ranged GET of at
most ``MAX_ENTRY_BYTES`` (an entry the sink writes is well under a kilobyte:
a larger one is refused, naming it and its size, without reading it); and
what a commit or repair entry claims is trusted only as far as the store
decided (``reconcile.core.claims``, asked by the sink).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reconcile.core import hooks
from reconcile.core.claims import Claim
from reconcile.core.contract import FatalError, Retryable, SinkOutcome, SinkTxnId, TxnIdParseError
from sinks.files.layout import Fences
from sinks.s3.objects import Bucket, PreconditionFailed

__all__ = ["APPEND", "MAX_ENTRY_BYTES", "CommitEntry", "CommitLog", "LogState", "RepairEntry"]

# The moment between the check of the log's state and the conditional put of
# the next entry: another writer appending here must make this put fail.
APPEND = hooks.declare("s3_file_sink.log.append")

_DIR = "log/"
_WIDTH = 20
# A writer that loses the race for the next entry this many times in a row
# gives up with a Retryable outcome (nothing was written): unbounded retries
# would hide a sink that too many writers share.
_ATTEMPTS = 32
# The most bytes one log entry may hold. The sink's own entries are a few
# hundred bytes (names, ids, counts); a thousand times that is refused as no
# entry of ours, unread, instead of parsed whole into memory.
MAX_ENTRY_BYTES = 1 << 20


@dataclass(frozen=True)
class CommitEntry:
    """One committed epoch: the txn that committed it, its batch and its writer's log."""

    seq: int
    txn: str
    rows: int
    log_id: str | None
    batch: str

    def claim(self, sink: str, what: str, where: str, epoch: int) -> Claim:
        """What it claims: ``epoch`` (its key's), by the generation its txn id names.

        ``where`` is its URI. A txn id that does not parse names no generation.
        """
        try:
            generation: int | None = SinkTxnId.from_string(self.txn).generation
        except TxnIdParseError:
            generation = None
        return Claim(sink=sink, what=what, record=f"commit entry {where}", kind="commit",
                     epoch=epoch, generation=generation)  # fmt: skip


@dataclass(frozen=True)
class RepairEntry:
    """One repair: its batch, the epoch it brings the sink to, and the epochs it stands for.

    A repair written by ``reconcile repair`` after epochs were lost stands for
    ``first_epoch`` to ``epoch`` of its pipeline and sink, as the markers the
    database sinks write for them: a later replay of one of those epochs must
    find it committed, or its old rows would be folded over the repair's.
    """

    seq: int
    pipeline: str
    sink: str
    first_epoch: int | None  # None: the repair stands for no epoch (rows only)
    epoch: int
    log_id: str | None
    batch: str
    repair_id: str
    generation: int | None = None  # the repairing writer's (None: an operator's, or older)

    def claim(self, sink: str, what: str, where: str) -> Claim:
        """What it claims: ``first_epoch`` to ``epoch`` (``where``: its URI)."""
        return Claim(
            sink=sink,
            what=what,
            record=f"repair entry {where}",
            kind="repair",
            epoch=self.epoch,
            first_epoch=self.first_epoch,
            generation=self.generation,
        )


@dataclass
class LogState:
    """What the log's entries fold into, as of entry ``end`` (-1: empty log)."""

    end: int = -1
    fences: Fences = field(default_factory=Fences)
    # (pipeline, sink, epoch) -> the first commit entry of that epoch.
    committed: dict[tuple[str, str, int], CommitEntry] = field(default_factory=dict)
    repairs: list[RepairEntry] = field(default_factory=list)

    def newest(self, pipeline: str, sink: str) -> int | None:
        """The newest epoch of ``pipeline`` and ``sink``: committed, or stood for by a repair."""
        epochs = [e for (p, s, e) in self.committed if p == pipeline and s == sink]
        for repair in self.repairs:
            if (repair.pipeline, repair.sink) == (
                pipeline,
                sink,
            ) and repair.first_epoch is not None:
                epochs.append(repair.epoch)
        return max(epochs, default=None)

    def covering(self, pipeline: str, sink: str, epoch: int) -> RepairEntry | None:
        """The repair that stands for ``epoch`` (the first in the log), if one does."""
        for repair in self.repairs:
            if (repair.pipeline, repair.sink) != (pipeline, sink) or repair.first_epoch is None:
                continue
            if repair.first_epoch <= epoch <= repair.epoch:
                return repair
        return None

    def batches(self) -> list[tuple[int, str, int]]:
        """(seq, batch, epoch) of every commit and repair in log order: what the sink holds."""
        found = [(c.seq, c.batch, key[2]) for key, c in self.committed.items()]
        found += [(r.seq, r.batch, r.epoch) for r in self.repairs]
        return sorted(found)

    def fold(self, seq: int, entry: dict[str, Any], where: str) -> None:
        """Apply entry ``seq`` (the next one) to the state."""
        kind = entry.get("kind")
        if kind == "fence":
            pipeline, generation = str(entry["pipeline"]), int(entry["generation"])
            # Monotonic: an entry can only raise a pipeline's fence.
            if generation > self.fences.generation(pipeline).generation:
                self.fences = self.fences.with_generation(pipeline, generation, entry["log_id"])
        elif kind == "commit":
            key = (str(entry["pipeline"]), str(entry["sink"]), int(entry["epoch"]))
            # First one wins: the writers' check refuses a second commit of an
            # epoch, and should one ever be found it changes nothing visible.
            found = CommitEntry(
                seq, str(entry["txn"]), int(entry["rows"]), entry["log_id"], str(entry["batch"])
            )
            self.committed.setdefault(key, found)
        elif kind == "repair":
            first, by = entry.get("first_epoch"), entry.get("generation")
            self.repairs.append(RepairEntry(
                seq, str(entry["pipeline"]), str(entry["sink"]),
                None if first is None else int(first), int(entry["epoch"]), entry["log_id"],
                str(entry["batch"]), str(entry["repair_id"]), None if by is None else int(by),
            ))  # fmt: skip
        else:
            raise FatalError(f"{where}: log entry {seq} has unknown kind {kind!r}", path=where)
        self.end = seq


class CommitLog:
    """The log under a sink root: read to its end, and appended to by conditional put."""

    def __init__(self, bucket: Bucket) -> None:
        self.bucket = bucket
        self.state = LogState()

    def refresh(self) -> LogState:
        """Read the entries appended since the last read; the state as of the log's end.

        Raises:
            FatalError: an entry is unreadable or out of sequence (the log is damaged:
                it is never read past a gap, which could hide a fence), or larger
                than MAX_ENTRY_BYTES (ObjectTooLargeError: it is not read).
        """
        start = None if self.state.end < 0 else self._name(self.state.end)
        for relative in self.bucket.list(_DIR, start_after=start):
            seq = self._seq(relative)
            if seq is None:
                continue  # not an entry (a stray object under log/)
            where = self.bucket.uri(relative)
            if seq != self.state.end + 1:
                raise FatalError(
                    f"{where}: the log skips from entry {self.state.end} to {seq}; an entry was "
                    "removed by hand. Stop every writer of this sink and restore it.",
                    path=where,
                )
            # Bounded: an entry of any size someone put here costs at most
            # MAX_ENTRY_BYTES to refuse (ObjectTooLargeError names it).
            raw = self.bucket.get_bounded(relative, MAX_ENTRY_BYTES)
            try:
                entry = json.loads(raw or b"")
                if not isinstance(entry, dict):
                    raise ValueError("not a JSON object")
                self.state.fold(seq, entry, where)
            except (ValueError, KeyError, TypeError) as exc:
                raise FatalError(
                    f"{where}: log entry {seq} is unreadable ({exc}: {(raw or b'')[:100]!r}); "
                    "nothing is read past it, which could hide a fence",
                    path=where,
                ) from exc
        return self.state

    def append(
        self, entry: dict[str, Any], check: Callable[[LogState], SinkOutcome | None]
    ) -> SinkOutcome | None:
        """Put ``entry`` as the log's next entry, if ``check`` passes on the state it follows.

        ``check`` sees the state the entry would follow and returns an outcome
        to stop with (the entry is not written), or None to write it. A lost
        race (412) re-reads the new entries and checks again.

        Returns:
            None when the entry was written; else ``check``'s outcome, or
            Retryable after too many lost races (nothing written).
        """
        for _ in range(_ATTEMPTS):
            state = self.refresh()
            stop = check(state)
            if stop is not None:
                return stop
            seq = state.end + 1
            hooks.point(APPEND)
            try:
                self.bucket.put(
                    self._name(seq), json.dumps(entry, sort_keys=True).encode(), if_none_match=True
                )
            except PreconditionFailed:
                continue  # another writer took entry `seq`: read it, check again
            # Fold our own entry now: the next refresh lists only after it.
            self.state.fold(seq, entry, self.bucket.uri(self._name(seq)))
            return None
        return Retryable(
            f"{self.bucket.uri(_DIR)}: lost the race for the next log entry {_ATTEMPTS} times "
            "(other writers append to this sink); nothing was written"
        )

    @staticmethod
    def _name(seq: int) -> str:
        return f"{_DIR}{seq:0{_WIDTH}d}.json"

    @staticmethod
    def _seq(relative: str) -> int | None:
        stem = relative.removeprefix(_DIR).removesuffix(".json")
        if len(stem) != _WIDTH or not stem.isdigit():
            return None
        return int(stem)
