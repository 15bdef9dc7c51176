"""The delta backend, as it declares itself to ``sinks.registry``.

Delta tables on a local disk (delta-rs, a base dependency): ``delta:///path``.
It needs nothing beyond the base install. Recovery pulls a Delta version into
Arrow and repairs in one commit (``sinks.delta.recovery``).
"""

from __future__ import annotations

from sinks.base import PULLABLE, Backend

__all__ = ["BACKEND"]

BACKEND = Backend(
    name="delta",
    schemes=("delta",),
    open="sinks.delta.sink:open_uri",
    capabilities={PULLABLE: "sinks.delta.factory:pullable_sink"},
)
