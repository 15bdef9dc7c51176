"""What a record in a sink may claim: only epochs the store decided, only by this pipeline's writer.

Every sink keeps records that say "this epoch is in": an Iceberg snapshot's
summary and the table's newest-epoch property, an S3 commit-log entry, a
marker row, a Delta commit's token, and repairs that stand for several epochs
at once. A sink that finds such a record for an epoch answers "already
committed" and writes nothing. Whoever can write the table or the bucket can
write one too: a forged repair record claiming epochs 1 to 1,000,000 would
make every later epoch report success and write nothing.

The rule, kept here once for every sink (and for whatever sink comes next):

- a record is evidence only for epochs the store has decided: no epoch it
  claims may be past the newest one the store decided (``Decided.epoch``).
  The writer commits an epoch into a sink only after the store decided it,
  and a repair stands only for epochs up to its target, which the store had
  decided: a record that claims more was not written by this pipeline;
- only with a writer generation the store granted: not newer than the
  newest one the progress log handed out (``Decided.generation``, the fence);
- only of this pipeline's progress log (``log_id``): each sink compares the
  log id first, and refuses another log's record as a MarkerMismatchError that
  says whose it is (``sinks.ownership``, ``sinks.postgres.ownership``). The
  records that pass that comparison are the ones :func:`check_claim` judges.

A record that breaks the rule is refused loudly: :func:`check_claim` returns an
:class:`~reconcile.core.errors.UntrustedRecordError` naming the sink, the
record and the epochs it claims (a MarkerMismatchError, so terminal: the
pipeline stops, and a restart would meet the same record), logs it at ERROR
and counts ``sink.untrusted_record`` [sink, kind]. The sink returns it as a
``Fatal``, never OK: the engine never skips an epoch on its word.

How the bound reaches the sinks, which know nothing of the store: the
coordinator binds every sink to a ``WriterIdentity`` whose ``decisions`` (a
:class:`Decisions`) reads the store's progress log when asked. A sink asks
only when it finds a record (a replay, a retry after a lost reply, a
forgery): a new epoch's prepare and commit find none, and read nothing more.
It is read when asked, not copied at start-up, so that a record written by a
newer writer of the same pipeline is within the bound (the stale writer that
meets it is refused by the fence, as before), never taken for a forgery.

Recovery (``reconcile.recovery``) holds the sink's newest recorded epoch to
the store's newest epoch the same way, with a :class:`Decided` value.

A sink used directly, without a commit cycle (``decisions`` is None), has no
store to ask: its records are compared by log id only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from reconcile.core.errors import UntrustedRecordError
from reconcile.core.metrics import active

__all__ = ["Claim", "Decided", "Decisions", "check_claim"]

log = logging.getLogger("reconcile.claims")


@dataclass(frozen=True, slots=True)
class Decided:
    """What the store has decided for one pipeline: the bound every record in a sink is held to.

    A ``Decided`` is also a :class:`Decisions` that always answers itself
    (recovery, which reads the store once, uses it so).

    Attributes:
        epoch: the newest epoch the store decided (committed); None: none yet.
        generation: the newest writer generation the progress log granted (the
            fence); None: not known (a record's generation is then not checked).
    """

    epoch: int | None
    generation: int | None = None

    def decided(self) -> Decided:
        """Itself."""
        return self

    def describe(self) -> str:
        """The bound as it reads in a message."""
        epochs = "no epoch yet" if self.epoch is None else f"epochs up to {self.epoch}"
        fence = "" if self.generation is None else f", writer generations up to {self.generation}"
        return f"{epochs}{fence}"


class Decisions(Protocol):
    """Where a sink learns what the store decided (``WriterIdentity.decisions``)."""

    def decided(self) -> Decided:
        """The store's decisions as they stand now.

        Raises:
            RetryableError: the store cannot be read now.
        """
        ...


@dataclass(frozen=True, slots=True)
class Claim:
    """What one record in a sink says: which epochs are in, and which writer put them there.

    Attributes:
        sink: the sink's name (the metric's label).
        what: the sink as messages name it (``Iceberg sink 'orders' (lake.shop.orders)``).
        record: where the record is, so an operator can find it (a snapshot
            id, a log entry's URI, a marker row, a table property).
        kind: ``commit`` (one epoch's), ``repair`` (it stands for several),
            ``newest epoch`` (a high-water mark) or ``fence`` (a generation only).
        epoch: the newest epoch it claims; None for a fence.
        first_epoch: the oldest epoch it claims (a repair's); None: ``epoch`` alone.
        generation: the writer generation it names; None: it names none.
    """

    sink: str
    what: str
    record: str
    kind: str
    epoch: int | None
    first_epoch: int | None = None
    generation: int | None = None

    def epochs(self) -> str:
        """The epochs it claims, as they read in a message."""
        if self.epoch is None:
            return "no epoch"
        first = self.epoch if self.first_epoch is None else self.first_epoch
        return f"epoch {self.epoch}" if first == self.epoch else f"epochs {first} to {self.epoch}"


def check_claim(claim: Claim, decisions: Decisions | None) -> UntrustedRecordError | None:
    """None if the store's decisions back ``claim``; else the error that refuses the record.

    The record is trusted only if every epoch it claims is one the store has
    decided, and its generation (if it names one) is one the store granted.
    A refusal is logged at ERROR and counted (``sink.untrusted_record``).

    Args:
        claim: what the record says (a record of this writer's progress log:
            the sink refuses another log's records itself).
        decisions: the bound writer's ``WriterIdentity.decisions``; None (a
            sink used directly): nothing to check against, so None.

    Raises:
        RetryableError: the store cannot be read now (from ``decisions``).
    """
    if decisions is None:
        return None
    decided = decisions.decided()
    past = claim.epoch is not None and (decided.epoch is None or claim.epoch > decided.epoch)
    newer = (
        claim.generation is not None
        and decided.generation is not None
        and claim.generation > decided.generation
    )
    if not past and not newer:
        return None
    names = "" if claim.generation is None else f" of writer generation {claim.generation}"
    message = (
        f"{claim.what}: {claim.record} is a {claim.kind} record{names} that claims "
        f"{claim.epochs()}, but the store has decided {decided.describe()}. This pipeline's "
        "writer never writes such a record: someone who can write the sink wrote it. It is "
        "NOT trusted: no epoch is taken as committed on its word, and nothing was written. "
        "Find who wrote it, remove it, and bring the sink to its expected state "
        "(reconcile repair) before going on."
    )
    log.error("%s", message)
    active().count("sink.untrusted_record", sink=claim.sink, kind=claim.kind)
    return UntrustedRecordError(
        message,
        sink=claim.sink,
        record=claim.record,
        kind=claim.kind,
        first_epoch=claim.first_epoch if claim.first_epoch is not None else claim.epoch,
        epoch=claim.epoch,
        generation=claim.generation,
        decided_epoch=decided.epoch,
        fence=decided.generation,
    )
