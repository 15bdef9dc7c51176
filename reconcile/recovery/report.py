"""What a verify or repair found and did, as numbers."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from reconcile.core.contract import (
    MassChangeError,
    StoreIntegrityError,
    StoreLostRowsError,
    UntrustedRecordError,
)

__all__ = ["ReconcileReport", "refused_fields"]


@dataclass(frozen=True)
class ReconcileReport:
    """The outcome of verifying (and maybe repairing) one sink table.

    Attributes:
        table: the sink table.
        mode: the mode that ran (full, scoped, buckets).
        reason: why that mode ran.
        target_epoch: the epoch whose expected state the sink was compared with.
        rows_pulled: rows read from the sink.
        buckets_compared: buckets whose checksums were compared (buckets mode).
        buckets_differing: of those, how many differed.
        missing: keys the sink lacked.
        extra: rows the sink held but should not.
        changed: keys the sink held with other values.
        applied: rows written or deleted to repair (0 for verify and dry runs).
        seconds: wall-clock duration.
        dry_run: nothing was written.
        brake_counted: extra and changed rows the mass-change brake counts (not
            the rows of epochs the sink had no marker for: see ``brake.py``).
        brake_limit: the most rows a repair may delete or change on its own
            (None: nothing was counted, so the table was not counted either).
        sink_rows: the rows the sink table held, when the brake counted them.
        mass_change: ``brake_counted`` is over ``brake_limit``: a repair is
            refused unless the brake is lifted (and then this one went through).
        warnings: what the run found worth an operator's attention (each also
            logged), e.g. scoped mode on a table without an index on ``_epoch``.
        provenance: up to ``provenance_rows`` differing rows, each with its
            ``kind`` (changed, extra, missing), ``key``, differing ``columns``
            (changed rows), last writing transaction (``xid``, as text), its
            ``committed_at`` (ISO 8601, or None), ``writer`` (engine, foreign,
            unknown, or none for a missing row) and a ``note`` on any None
            (``reconcile/recovery/provenance.py``).
        provenance_note: why provenance is missing or partial, e.g. "not
            available on this sink", or commit times not tracked; "" otherwise.
        foreign_writes: how many of the traced rows a foreign transaction
            wrote (0 without drift); None when tracing is off or the sink
            cannot say.
        foreign_rows: how many of all the differing rows (changed and extra)
            a foreign transaction wrote, traced or not; None when unknown.
        foreign_transactions: how many distinct foreign transactions wrote them.
        repair_wait_s: how long this repair waited for another repair of the
            table to finish before it pulled (0.0: it did not wait); what it
            found is what that repair left.
        repair_waited_for: whose repair it waited for (e.g. "backend pid 4242
            (reconcile-cli)"); "" when it did not wait.
        scope: what scoped mode looked at (the keys the store changed after an
            epoch, and the sink's rows of later epochs): drift elsewhere in the
            table is not looked at; "" when every row was (full, buckets).
    """

    table: str
    mode: str
    reason: str
    target_epoch: int | None
    rows_pulled: int
    buckets_compared: int
    buckets_differing: int
    missing: int
    extra: int
    changed: int
    applied: int
    seconds: float
    dry_run: bool
    brake_counted: int = 0
    brake_limit: int | None = None
    sink_rows: int | None = None
    mass_change: bool = False
    warnings: tuple[str, ...] = ()
    provenance: tuple[dict[str, Any], ...] = ()
    provenance_note: str = ""
    foreign_writes: int | None = None
    foreign_rows: int | None = None
    foreign_transactions: int | None = None
    repair_wait_s: float = 0.0
    repair_waited_for: str = ""
    scope: str = ""

    @property
    def drift(self) -> bool:
        return bool(self.missing or self.extra or self.changed)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)


def refused_fields(error: BaseException) -> dict[str, Any] | None:
    """A verify or repair that refused to run, as report fields; None for any other error.

    ``refused`` says why, in a word an alert can match: ``store_lost_rows``
    (the store lost rows: never reported as extra sink rows),
    ``store_integrity`` (the store holds what the engine did not write) or
    ``mass_change`` (the brake) or ``untrusted_record`` (the sink records an
    epoch the store never decided); the error's details (files, epochs, counts) follow.
    """
    if isinstance(error, StoreLostRowsError):
        reason = "store_lost_rows"
    elif isinstance(error, StoreIntegrityError):
        reason = "store_integrity"
    elif isinstance(error, MassChangeError):
        reason = "mass_change"
    elif isinstance(error, UntrustedRecordError):
        reason = "untrusted_record"
    else:
        return None
    fields = {k: v for k, v in error.details.items() if k != "table"}
    fields["refused"] = reason
    return fields
