"""Stable change ids: UUIDv7 layout, derived from where a change came from."""

from __future__ import annotations

import hashlib
import uuid

from reconcile.core.contract import InvalidInputError, validate_name

__all__ = ["change_id"]

_MAX_TS_MS = (1 << 48) - 1


def change_id(
    pipeline: str,
    epoch: int,
    source_position: str | int,
    ordinal: int,
    *,
    epoch_time_ms: int | None = None,
) -> uuid.UUID:
    """Return the stable id of one change.

    The same (pipeline, epoch, source position, output ordinal) always gives the
    same id, so a replayed epoch produces the same ids and an append-only target
    can drop the replay with ``ON CONFLICT DO NOTHING``. The layout is UUIDv7
    (RFC 9562): the 48 time bits are ``epoch_time_ms`` when the epoch has a
    wall-clock start, else the epoch number itself, so ids sort by epoch; the 74
    "random" bits are a BLAKE2b digest of the origin.

    Args:
        pipeline: pipeline name.
        epoch: epoch number (>= 0).
        source_position: where the input came from (offset, file:line, ...).
        ordinal: index of this change among the outputs of that input (>= 0).
        epoch_time_ms: optional wall-clock start of the epoch, in Unix ms.

    Raises:
        InvalidInputError: if a number is negative or out of range.
    """
    validate_name("pipeline", pipeline)
    if epoch < 0 or ordinal < 0:
        raise InvalidInputError(
            f"change_id: epoch and ordinal must be >= 0, got {epoch}, {ordinal}"
        )
    ts = epoch if epoch_time_ms is None else epoch_time_ms
    if not 0 <= ts <= _MAX_TS_MS:
        raise InvalidInputError(f"change_id: time field {ts} does not fit in 48 bits")
    origin = (
        f"{pipeline}\x1f{epoch}\x1f{type(source_position).__name__}:{source_position}\x1f{ordinal}"
    )
    digest = int.from_bytes(hashlib.blake2b(origin.encode(), digest_size=10).digest(), "big")
    rand_a = digest >> 68  # 12 bits
    rand_b = digest & ((1 << 62) - 1)  # 62 bits
    value = (ts << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return uuid.UUID(int=value)
