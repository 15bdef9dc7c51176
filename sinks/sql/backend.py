"""The SQL backend (SQLAlchemy Core), as it declares itself to ``sinks.registry``.

It takes the URL of any other database SQLAlchemy ships a dialect for
(PostgreSQL's are the postgres backend's); it is the generic backend, what
recovery uses for PostgreSQL too when a caller turns the fast path off.
"""

from __future__ import annotations

import re

from sinks.base import PULLABLE, Backend

__all__ = ["BACKEND", "DIALECTS"]

# The dialects SQLAlchemy ships but PostgreSQL's (a URL's scheme is dialect
# or dialect+driver): no connection string is taken by two backends.
DIALECTS = frozenset({"sqlite", "mysql", "mariadb", "mssql", "oracle"})
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9]*)(\+[A-Za-z0-9_]+)?://")


def _is_sqlalchemy_url(connection: str) -> bool:
    match = _SCHEME.match(connection.strip())
    return match is not None and match.group(1).lower() in DIALECTS


BACKEND = Backend(
    name="sql",
    schemes=(),
    open="sinks.sql.factory:open_uri",
    extra="sql",
    requires=("sqlalchemy",),
    capabilities={PULLABLE: "sinks.sql.sink:SqlSink"},
    accepts=_is_sqlalchemy_url,
    generic=True,
)
