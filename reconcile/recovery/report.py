"""What a verify or repair found and did, as numbers."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ReconcileReport"]


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
        warnings: what the run found worth an operator's attention (each also
            logged), e.g. scoped mode on a table without an index on ``_epoch``.
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
    warnings: tuple[str, ...] = ()

    @property
    def drift(self) -> bool:
        return bool(self.missing or self.extra or self.changed)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)
