"""How a table is recovered: the options of ``recover``, one frozen value."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from reconcile.core.contract import ConfigurationError
from reconcile.core.target import Progress
from reconcile.recovery.brake import DEFAULT_MAX_CHANGE_FRACTION, Brake
from reconcile.recovery.modes import Mode
from reconcile.recovery.provenance import DEFAULT_PROVENANCE_ROWS

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "MemoryKeywords",
    "RecoverKeywords",
    "RecoverOptions",
    "TuningKeywords",
]

# Rows of each side a full verify holds at once. About 150 MB of a 16-column
# table such as TPC-H lineitem per side; a table at most this size is diffed
# in memory, without spilling.
DEFAULT_CHUNK_ROWS = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoverOptions:
    """How ``recover`` (and the engine under it) brings one sink table to its expected state.

    ``recover`` takes them as keywords (typed by :class:`RecoverKeywords`);
    ``reconcile_table`` takes the value.

    Attributes:
        mode: "full", "scoped", "buckets" or "auto" (see ``Mode``).
        dry_run: only report; write nothing.
        after_crash: recovery after a restart (auto then prefers scoped).
        target_epoch: the epoch to bring the sink to; default the store's newest.
        keys: the key columns; default the sink table's primary key.
        schema: the sink table's schema; default the connection's current one.
        fast_path: PostgreSQL through COPY and ADBC (default); False goes
            through SQLAlchemy like any other database.
        progress: called with (rows pulled, estimated total) during a full pull.
        sink: the sink's name, which names its store table and its markers,
            when it differs from the table (a config file's sink ``lines``
            writing table ``order_lines``); default the table's name.
        since_epoch: scoped mode checks the keys changed after this epoch
            (and the sink rows of later epochs) instead of after the sink's
            newest marker: a scheduled check of the recent epochs.
        max_change_fraction: the mass-change brake: the most of the table
            (rows it holds) a repair may delete or change, 0 to 1 (default
            0.1); the rows of epochs the sink has no marker for do not count
            (``reconcile/recovery/brake.py`` defines it exactly).
        allow_mass_change: lift the brake for this repair (after checking the
            difference: the brake is what stops a damaged store from emptying
            a healthy table).
        chunk_rows: full mode holds about this many rows of each side in
            memory: a larger table is pulled and read in parts by key hash,
            spilled to disk, and diffed part by part (``reconcile.core.spill``).
        spill_dir: where those parts are spilled (default: the system's
            temporary folder; the disk needs room for the table's keys and
            hashes, and for the expected rows when repairing).
        provenance_rows: up to this many differing rows are traced to the
            transaction that last wrote them (``provenance.py``; default 10);
            0 traces none.
    """

    mode: Mode | str = Mode.AUTO
    dry_run: bool = False
    after_crash: bool = False
    target_epoch: int | None = None
    keys: Sequence[str] | None = None
    schema: str | None = None
    fast_path: bool = True
    progress: Progress | None = None
    sink: str | None = None
    since_epoch: int | None = None
    max_change_fraction: float = DEFAULT_MAX_CHANGE_FRACTION
    allow_mass_change: bool = False
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    spill_dir: str | None = None
    provenance_rows: int = DEFAULT_PROVENANCE_ROWS

    def __post_init__(self) -> None:
        if (
            isinstance(self.provenance_rows, bool)
            or not isinstance(self.provenance_rows, int)
            or self.provenance_rows < 0
        ):
            raise ConfigurationError(
                "recover: provenance_rows must be a number of rows (0 or more), got "
                f"{self.provenance_rows!r}"
            )
        if (
            isinstance(self.chunk_rows, bool)
            or not isinstance(self.chunk_rows, int)
            or (self.chunk_rows < 1)
        ):
            raise ConfigurationError(
                f"recover: chunk_rows must be a positive number of rows, got {self.chunk_rows!r}"
            )

    def chosen_mode(self) -> Mode:
        """``mode`` as a ``Mode``.

        Raises:
            ConfigurationError: not one of the modes (the value is named).
        """
        if isinstance(self.mode, Mode):
            return self.mode
        try:
            return Mode(str(self.mode).lower())
        except ValueError:
            raise ConfigurationError(
                f"recover: mode must be one of {[m.value for m in Mode]}, got {self.mode!r}"
            ) from None

    def brake(self) -> Brake:
        """The mass-change brake these options set.

        Raises:
            ConfigurationError: ``max_change_fraction`` is not a number from 0 to 1.
        """
        return Brake(self.max_change_fraction, self.allow_mass_change)


class RecoverKeywords(TypedDict, total=False):
    """The keywords of :class:`RecoverOptions`, for ``**options`` (see its attributes)."""

    mode: Mode | str
    dry_run: bool
    after_crash: bool
    target_epoch: int | None
    keys: Sequence[str] | None
    schema: str | None
    fast_path: bool
    progress: Progress | None
    sink: str | None
    since_epoch: int | None
    max_change_fraction: float
    allow_mass_change: bool
    chunk_rows: int
    spill_dir: str | None
    provenance_rows: int


class MemoryKeywords(TypedDict, total=False):
    """How full mode and a first bucket search bound memory (``chunk_rows``, ``spill_dir``).

    Absent keys take ``RecoverOptions``' defaults.
    """

    chunk_rows: int
    spill_dir: str | None


class TuningKeywords(MemoryKeywords, total=False):
    """``MemoryKeywords`` and how many differing rows are traced to their writer.

    What a config file's check passes on to ``recover`` unchanged; absent keys
    take ``RecoverOptions``' defaults.
    """

    provenance_rows: int
