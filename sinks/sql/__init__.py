"""A transactional exactly-once sink, and pull-and-diff recovery, for any SQLAlchemy database.

Nothing is imported here: ``backend`` declares the backend to ``sinks.registry``
and must be readable without the optional dependencies this backend needs
(``pip install 'reconcile-engine[sql]'``).
Its public names are imported on first use (the sink: ``sinks.sql.sink.SqlSink``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.base import lazy_exports

if TYPE_CHECKING:
    from .sink import SqlSink

__all__ = ["SqlSink"]

__getattr__ = lazy_exports(
    __name__,
    {
        "SqlSink": "sink",
    },
)
