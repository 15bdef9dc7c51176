"""PostgreSQL exactly-once sink: transactional and prepared-transaction (2PC) modes."""

from __future__ import annotations

from .connection import PgTarget, redact_text
from .sink import PostgresSink

__all__ = ["PgTarget", "PostgresSink", "redact_text"]
