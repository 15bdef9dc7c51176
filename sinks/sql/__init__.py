"""A transactional exactly-once sink, and pull-and-diff recovery, for any SQLAlchemy database."""

from .sink import SqlSink

__all__ = ["SqlSink"]
