"""What recovery needs from a sink's system: a consistent snapshot to pull from, and an apply.

The engine (``reconcile.recovery.engine``) is written against these protocols;
``sinks.postgres.recovery`` implements them for PostgreSQL (COPY into Arrow,
checksums in the database) and ``sinks.sql`` for any database SQLAlchemy speaks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn, Protocol, TypeGuard

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.conform import SinkColumn
from reconcile.core.contract import InvalidInputError
from reconcile.core.sink import capabilities_of

__all__ = [
    "WRITER_COLUMNS",
    "KeyRange",
    "NoRowChecksums",
    "Progress",
    "PullableSink",
    "RecoveryTarget",
    "Repair",
    "RepairTurn",
    "SinkSnapshot",
    "is_pullable",
    "repair_turn",
]

# The columns a sink's provenance lookup adds to the rows it pulls again (the
# row's writing xid, its commit time, whether the engine wrote it, and whether
# it predates the oldest kept marker): named once, for the sinks that add them
# and for recovery, which reads them.
WRITER_COLUMNS = ("_writer_xid", "_writer_committed_at", "_writer_engine", "_writer_before_epoch")

# Called with (rows pulled so far, the table's estimated size or None).
Progress = Callable[[int, int | None], None]


@dataclass(frozen=True)
class KeyRange:
    """Rows whose first key column is in ``[lo, hi)``; None is unbounded on that side."""

    lo: Any = None
    hi: Any = None


class SinkSnapshot(Protocol):
    """One consistent view of the sink table and its newest marker (REPEATABLE READ)."""

    @property
    def newest_epoch(self) -> int | None:
        """The newest epoch whose marker the sink holds for (pipeline, sink); None: none."""
        ...

    @property
    def warnings(self) -> list[str]:
        """What the pulls found worth an operator's attention (e.g. a missing index)."""
        ...

    @property
    def narrow_ranges(self) -> bool:
        """A key range's rows are read through an index, at a cost that follows them.

        Without one, every range query scans the table, so buckets mode does
        not cut differing ranges further (each level would cost a scan).
        """
        ...

    def pull_all(self, progress: Progress | None) -> pa.Table:
        """Every row, the expected state's columns (the sink's own types)."""
        ...

    def pull_each(self, each: Callable[[pa.Table], None], progress: Progress | None) -> None:
        """Every row, as ``pull_all``, handed to ``each`` a batch at a time (bounded memory)."""
        ...

    def estimated_rows(self) -> int | None:
        """The table's rows as the database estimates them, cheaply; None: no estimate."""
        ...

    def pull_keys(self, keys: pa.Table, newer_than: int) -> pa.Table:
        """The rows whose key is in ``keys``, and the rows whose ``_epoch`` is > ``newer_than``."""
        ...

    def count_rows(self) -> int:
        """The rows the table holds in this snapshot (what the mass-change brake weighs)."""
        ...

    def check_buckets(self) -> None:
        """Raise InvalidInputError if buckets mode cannot run on this table (naming why)."""
        ...

    def bucket_sums(
        self, bounds: list[Any], within: Sequence[KeyRange]
    ) -> dict[int, tuple[int, int]]:
        """Per bucket of the first key column: (rows, sum of row checksums mod 2**64).

        Bucket ``i`` holds the rows in any of the (disjoint) ranges ``within``
        with ``bounds[i-1] <= key < bounds[i]`` (``width_bucket`` numbering: 0
        below the first bound). One query, however many ranges, whose text and
        cost do not grow with their number (the ranges are data).
        """
        ...

    def pull_ranges(self, ranges: Sequence[KeyRange]) -> pa.Table:
        """The rows whose first key column is in one of the (disjoint) ranges, in one query.

        The query's text must not grow with the number of ranges (they are data).
        """
        ...


class _Named(Protocol):
    """What :class:`NoRowChecksums` needs of its recovery target: the table's name."""

    @property
    def display(self) -> str: ...


class NoRowChecksums:
    """A snapshot of a system that cannot checksum rows: buckets mode is refused, naming why.

    Buckets mode compares per-range sums that the sink's own system computes
    next to its rows; a topic, an object store or an Iceberg table has no such
    query, and pulling every row to sum it would cost more than mode full.
    """

    system: ClassVar[str]  # the system, as the message names it
    modes: ClassVar[str] = "full or scoped"  # the modes that can run instead
    target: _Named  # the recovery target (a subclass narrows it to its own)

    def check_buckets(self) -> None:
        name = self.target.display
        raise InvalidInputError(
            f"{name}: buckets mode needs the sink's system to checksum rows, which "
            f"{self.system} does not do; use mode {self.modes}",
            table=name,
        )

    def bucket_sums(self, bounds: list[Any], within: Any) -> dict[int, tuple[int, int]]:
        self.check_buckets()
        return {}

    def pull_ranges(self, ranges: Any) -> NoReturn:
        self.check_buckets()
        raise AssertionError("check_buckets refuses every table")  # pragma: no cover


@dataclass
class Repair:
    """What to write: the expected rows to upsert, the keys to delete, and the marker.

    Attributes:
        upserts: expected rows (keys and values) for the missing and changed keys.
        deletes: key columns of the rows the sink must not hold.
        target_epoch: the epoch whose expected state the sink is brought to.
        seen_newest: the sink's newest marker epoch in the pulled snapshot; the
            apply re-checks it under the fence lock and gives up (None) if it moved.
        counts: missing, extra and changed, recorded with the repair.
        mode: the mode that found the difference.
    """

    upserts: pa.Table
    deletes: pa.Table
    target_epoch: int
    seen_newest: int | None
    counts: dict[str, int] = field(default_factory=dict)
    mode: str = ""


@dataclass(frozen=True)
class RepairTurn:
    """A repair's turn at its table: how long it waited for another repair of it, and whose.

    Attributes:
        waited_s: seconds spent waiting (0.0: the table was free).
        holder: who held the table meanwhile (e.g. "backend pid 4242 (reconcile-cli)").
    """

    waited_s: float = 0.0
    holder: str = ""


def repair_turn(target: object) -> AbstractContextManager[RepairTurn]:
    """Hold ``target``'s table for this repair, from before its pull until it ends.

    A target that can serialise the repairs of its table has
    ``take_repair_turn()`` (a context manager yielding a ``RepairTurn``, which
    waits while another repair holds the table); for any other, no turn is
    taken and nothing waits.
    """
    take: Callable[[], AbstractContextManager[RepairTurn]] | None
    take = getattr(target, "take_repair_turn", None)
    return take() if take is not None else nullcontext(RepairTurn())


class RecoveryTarget(Protocol):
    """A sink table recovery can pull from and repair."""

    @property
    def display(self) -> str:
        """The table's name in messages (``schema.table``)."""
        ...

    @property
    def epoch_column(self) -> bool:
        """Rows carry ``_epoch`` (scoped mode can run)."""
        ...

    @property
    def bucket_checksums(self) -> bool:
        """The database computes bucket checksums (buckets mode can run)."""
        ...

    def columns(self) -> dict[str, SinkColumn]:
        """The sink table's columns (reflected), by name."""
        ...

    def key_columns(self) -> list[str]:
        """The sink table's key (its primary key, or the key it was given)."""
        ...

    def snapshot(self, schema: pa.Schema, keys: list[str]) -> AbstractContextManager[SinkSnapshot]:
        """Open a consistent snapshot for pulling the expected state's columns."""
        ...

    def apply(self, repair: Repair) -> int | None:
        """Apply the repair in ONE transaction with its marker.

        Returns:
            Rows written or deleted; None if the sink's newest marker moved since
            the snapshot (nothing was written: pull again).
        """
        ...


class PullableSink(Protocol):
    """A sink client whose table recovery can pull from (``capabilities.pullable``).

    What ``recover`` gets from the registry and what ``start()`` hands to
    ``recover_sink``; ``sinks.postgres`` and ``sinks.sql`` implement it.
    """

    @property
    def name(self) -> str:
        """The sink's name, as its markers name it."""
        ...

    @property
    def pipeline(self) -> str | None:
        """The pipeline of the writer it is bound to; None while unbound."""
        ...

    def recovery_target(
        self, pipeline: str, generation: int | None, *, write: bool
    ) -> RecoveryTarget:
        """The sink's table as a pull-and-diff target, repairing as ``generation``'s writer."""
        ...

    def close(self) -> None:
        """Close the client's connections."""
        ...


def is_pullable(sink: object) -> TypeGuard[PullableSink]:
    """Whether ``sink`` declares that its rows can be pulled (``capabilities.pullable``)."""
    return capabilities_of(sink).pullable
