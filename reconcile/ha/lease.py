"""The lease of a highly available pipeline, from the backend of its database.

The lease is a capability of a sink backend (``sinks.base.LEASE``): for
PostgreSQL a row in the sink database (``sinks.postgres.lease.PgLease``). The
HA node is written against ``reconcile.core.lease.Lease``.
"""

from __future__ import annotations

from typing import Any

from reconcile.core.lease import DEFAULT_TERM_S, Lease
from sinks import registry
from sinks.base import LEASE

__all__ = ["open_lease"]


def open_lease(dsn: str, pipeline: str, *, term_s: float = DEFAULT_TERM_S, **options: Any) -> Lease:
    """The leadership lease of ``pipeline`` in the database at ``dsn``.

    Args:
        dsn: a connection string of a backend that provides a lease (a libpq
            DSN or a ``postgresql://`` URL).
        pipeline: the pipeline's name.
        term_s: how long a taken or renewed lease lasts.
        **options: the backend's own (Postgres: ``holder``, ``schema``, ``owner``).

    Raises:
        ConfigurationError: no backend of ``dsn`` provides a lease (naming
            those that do), its extra is not installed, or a bad option.
    """
    lease: Lease = registry.capability(dsn, LEASE)(dsn, pipeline, term_s=term_s, **options)
    return lease
