"""The expected-state store as recovery reads it: one sink table's expected rows, by epoch.

``expected_state.store.ExpectedStateStore`` is the implementation (Delta
tables); recovery, the Spark verify job and the HA takeover are written
against this protocol, so they need not import the store's package to say
what they use of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

__all__ = ["ExpectedStore"]


class ExpectedStore(Protocol):
    """One sink table's expected state (keys, values, ``_row_hash``, ``_epoch``) at every epoch."""

    @property
    def pipeline(self) -> str:
        """The pipeline whose expected state this is."""
        ...

    @property
    def sink(self) -> str:
        """The sink (and table) name, as the markers name it."""
        ...

    @property
    def uri(self) -> str:
        """Where the table lives (named in messages)."""
        ...

    @property
    def key_columns(self) -> list[str]:
        """The key columns, in order."""
        ...

    @property
    def user_schema(self) -> pa.Schema | None:
        """The key and value columns (no engine columns); None before the first epoch."""
        ...

    def holding(self) -> AbstractContextManager[None]:
        """Within it, every version this object reads is kept from the store's vacuum."""
        ...

    def audit(self, version: int | None = None) -> None:
        """Check the table's files against its log (raises StoreIntegrityError)."""
        ...

    def last_epoch(self) -> int | None:
        """The newest epoch recorded; None when there is none."""
        ...

    def version_of(self, epoch: int) -> int:
        """The table version that holds the state as of ``epoch``."""
        ...

    def check_version(self, version: int) -> None:
        """Check what a reader other than the store reads at ``version``."""
        ...

    def snapshot(
        self,
        epoch: int | None = None,
        columns: Sequence[str] | None = None,
        *,
        keys: pa.Table | None = None,
        ranges: Sequence[tuple[Any, Any]] | None = None,
    ) -> pa.Table:
        """The expected state as of ``epoch`` (default the newest), optionally narrowed."""
        ...

    def stored_rows(self, epoch: int | None = None) -> int:
        """At least the rows of the snapshot as of ``epoch`` (the rows of its files)."""
        ...

    def snapshot_parts(
        self, epoch: int | None, columns: Sequence[str], *, parts: int, where: str | None = None
    ) -> Iterator[tuple[int, pa.Table]]:
        """The snapshot split by key hash into ``parts`` (``core.spill``), one at a time."""
        ...

    def changed_keys(self, since_epoch: int) -> pa.Table:
        """The keys the epochs after ``since_epoch`` touched."""
        ...

    def newest_changes(
        self, since_epoch: int, through_epoch: int, columns: Sequence[str]
    ) -> pa.Table:
        """For each key changed after ``since_epoch``, its newest change up to ``through_epoch``."""
        ...
