"""The mass-change brake: a repair that would delete or change too much of a sink table is refused.

The store check (``expected_state.integrity``) catches the store damage it
knows how to see; the brake is the backstop for the rest: whatever the cause,
a repair never rewrites most of a healthy table on its own.

The boundary, exactly:

* **counted**: the rows the repair would delete (extra) or overwrite
  (changed), except those of keys the store changed in an epoch after the
  sink's newest marker. Those are the sink catching up on epochs it lacks
  (a crash between the store's commit and the sink's, an HA takeover): the
  markers say the sink does not hold them yet, so changing them destroys
  nothing acknowledged. A sink without any marker catches up on nothing: all
  its deletes and changes count. Missing rows never count: inserting them
  destroys nothing.
* **the table**: the rows the sink table holds in the snapshot the diff was
  pulled from (full mode pulled them all; the other modes count them in the
  same snapshot, only when something is counted).
* **refused** when counted > ``max_change_fraction`` x table rows, compared
  exactly (the fraction as the decimal it was written as): a repair of
  exactly the fraction goes through. An empty table has nothing to delete or
  change, so the brake never stops it; with fraction 0 any counted change is
  refused; with 1 none is.

It applies to every repair, the engine's own included (``start()``'s
pull-and-diff and an HA takeover's ``recover_sinks``): what those repair is
the epochs a sink lacks, which is not counted. A brake that fires there means
the sink holds what neither its markers nor the store explain, and the
pipeline stops for an operator, who repairs with the brake lifted once the
difference is understood (``reconcile repair --allow-mass-change``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import ConfigurationError, InvalidInputError, StoreIntegrityError
from reconcile.core.expected import ExpectedStore
from reconcile.recovery.diff import Diff

__all__ = [
    "DEFAULT_MAX_CHANGE_FRACTION",
    "Brake",
    "BrakeReading",
    "counted_changes",
    "refusal",
]

DEFAULT_MAX_CHANGE_FRACTION = 0.1


def _fraction(value: object) -> Fraction:
    """``value`` as an exact fraction in [0, 1], as written (0.1 is 1/10, not a binary float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"max_change_fraction must be a number from 0 to 1, got {value!r}")
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise ConfigurationError(f"max_change_fraction must be from 0 to 1, got {value!r}")
    return Fraction(repr(float(value)))


@dataclass(frozen=True)
class Brake:
    """How much of a table a repair may delete or change on its own.

    Attributes:
        max_change_fraction: the most a repair may delete or change, as a
            fraction of the rows the sink table holds (default 0.1).
        allow_mass_change: lift the brake for this repair (an operator who has
            checked the difference); what it counts is still reported.
    """

    max_change_fraction: float = DEFAULT_MAX_CHANGE_FRACTION
    allow_mass_change: bool = False

    def __post_init__(self) -> None:
        _fraction(self.max_change_fraction)

    def limit(self, table_rows: int) -> int:
        """The most rows a repair may delete or change in a table of ``table_rows`` rows."""
        return math.floor(_fraction(self.max_change_fraction) * table_rows)


@dataclass(frozen=True)
class BrakeReading:
    """What the brake counted for one diff.

    Attributes:
        counted: extra and changed rows that are not the sink catching up.
        table_rows: the rows the sink table held (None: not counted, as
            nothing was counted).
        limit: the most a repair may delete or change (None with ``table_rows``).
    """

    counted: int
    table_rows: int | None
    limit: int | None

    @property
    def exceeded(self) -> bool:
        return self.limit is not None and self.counted > self.limit


def counted_changes(
    diff: Diff, store: ExpectedStore, newest: int | None, epoch: int, keys: list[str]
) -> int:
    """The extra and changed rows of ``diff`` the brake counts (see the module docstring).

    Reads the keys the store changed after the sink's newest marker, which
    costs what the catching up costs: nothing when the sink is up to date.
    """
    destroyed = pa.concat_tables([diff.extra.select(keys), diff.changed.select(keys)])
    if destroyed.num_rows == 0 or newest is None or newest >= epoch:
        return int(destroyed.num_rows)
    try:
        catching_up = store.changed_keys(newest).select(keys)
    except StoreIntegrityError:
        raise
    except InvalidInputError:
        # The change files after the marker are gone (vacuum): nothing can be
        # told apart from drift, so everything counts (the brake errs on the
        # side of stopping).
        return int(destroyed.num_rows)
    if catching_up.num_rows == 0:
        return int(destroyed.num_rows)
    catching_up = catching_up.cast(destroyed.schema)
    kept = destroyed.join(
        catching_up.group_by(keys).aggregate([]), keys=keys, join_type="left anti"
    )
    return int(kept.num_rows)


def refusal(display: str, reading: BrakeReading, counts: dict[str, int], brake: Brake,
            epoch: int) -> str:  # fmt: skip
    """The message of a repair the brake refused (the counts, the limit, what to do)."""
    return (
        f"table {display}: repair to epoch {epoch} refused by the mass-change brake: it would "
        f"delete or change {reading.counted} of the {reading.table_rows} rows the table holds "
        f"(extra {counts.get('extra', 0)}, changed {counts.get('changed', 0)}; missing rows, and "
        "rows of epochs the sink has no marker for, are not counted), more than "
        f"max_change_fraction {brake.max_change_fraction} allows ({reading.limit} rows); "
        "nothing was written. Check the store and the sink first (reconcile verify); if the "
        "sink really drifted this much, "
        "repair with the brake lifted: reconcile repair --allow-mass-change "
        "(allow_mass_change=True)"
    )
