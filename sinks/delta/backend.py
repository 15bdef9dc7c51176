"""The delta backend, as it declares itself to ``sinks.registry``.

Delta tables on a local disk (delta-rs, a base dependency): ``delta:///path``.
It needs nothing beyond the base install.
"""

from __future__ import annotations

from sinks.base import Backend

__all__ = ["BACKEND"]

BACKEND = Backend(name="delta", schemes=("delta",), open="sinks.delta.sink:open_uri")
