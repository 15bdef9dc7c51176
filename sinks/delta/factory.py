"""The Delta table recovery pulls from: what ``reconcile verify|repair`` gets from the registry.

Both Delta backends (``delta://``, written by delta-rs, and ``delta+spark://``,
written by Spark's Delta) name it here: their tables are read and repaired
alike (``sinks.delta.recovery`` says why one reader and writer serves both).
"""

from __future__ import annotations

from collections.abc import Sequence

from reconcile.core.contract import validate_name
from sinks.base import local_path, split_options
from sinks.delta.recovery import DeltaRecoveryTarget

__all__ = ["DeltaTableClient", "pullable_sink"]


class DeltaTableClient:
    """A Delta sink table as an operator's verify or repair reaches it (``PullableSink``)."""

    pipeline: str | None = None  # an operator's client serves no writer

    def __init__(self, name: str, uri: str, key: Sequence[str]) -> None:
        """The table at ``uri`` (its root folder) of sink ``name``, keyed by ``key``."""
        self.name, self.uri, self.key = name, uri, list(key)

    def recovery_target(
        self, pipeline: str, generation: int | None, *, write: bool
    ) -> DeltaRecoveryTarget:
        """The table as a pull-and-diff target, repairing as ``generation`` (None: operator)."""
        return DeltaRecoveryTarget(self.uri, self.name, pipeline, generation, key=self.key,
                                   log_id=None, write=write)  # fmt: skip

    def close(self) -> None:
        """Nothing to close: each read opens the table's log afresh."""


def pullable_sink(
    dsn: str,
    table: str,
    *,
    name: str,
    schema: str | None = None,
    key: Sequence[str] | None = None,
) -> DeltaTableClient:
    """The table ``<path>/<table>`` of ``delta:///path[?key=k1,k2]`` (or ``delta+spark://``).

    The sink writes its table at ``<path>/<sink name>``: ``table`` is that
    name. ``schema`` is not used (a Delta table has no namespace here).
    """
    base, options = split_options(dsn, ("key",))
    given = [k.strip() for k in options.get("key", "").split(",") if k.strip()]
    path = local_path(validate_name("sink", name), base)
    return DeltaTableClient(name, f"{path.rstrip('/')}/{table}", list(key or given))
