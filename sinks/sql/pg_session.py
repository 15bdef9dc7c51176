"""The settings every SQLAlchemy session to PostgreSQL pins, the same as the postgres sink's.

The generic SQL sink reaches PostgreSQL through SQLAlchemy (``postgresql+psycopg://``,
``postgresql+psycopg2://``), not through ``PgTarget``: its connections are
pinned here, on each new DBAPI connection of the engine's pool, with the
values of ``sinks.postgres.connection.SESSION_SETTINGS``. Without them a
database's or role's ``DateStyle`` decides whether a date the driver reads
as text parses at all (psycopg cannot parse ``SQL, DMY``), and
``extra_float_digits`` whether a float reads back exactly.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from sinks.postgres.connection import SESSION_SETTINGS

__all__ = ["pin_postgres_sessions"]

# One statement, no parameters: set_config takes the values as literals the
# session parses the same whatever standard_conforming_strings says (none
# holds a backslash or a quote).
_PIN = "SELECT " + ", ".join(
    f"pg_catalog.set_config('{name}', '{value}', false)" for name, value in SESSION_SETTINGS
)


def pin_postgres_sessions(engine: sa.Engine) -> None:
    """Make every connection ``engine`` opens to PostgreSQL pin ``SESSION_SETTINGS``.

    Other dialects are left alone (MariaDB's sessions are set up by its own
    dialect options). The settings are session-level and committed at once, so
    the pool's rollback on return does not undo them.
    """
    if engine.dialect.name != "postgresql":
        return

    def pin(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(_PIN)
        finally:
            cursor.close()
        dbapi_connection.commit()

    # insert=True: before SQLAlchemy's own first-connect checks read the session.
    sa.event.listen(engine, "connect", pin, insert=True)
