"""The SQL sink's set-up: its engine built from the URL, its target reflected and checked.

The engine's connections to MySQL and MariaDB get the engine's session
settings (``sessions.py``), those to PostgreSQL the Postgres sink's
(``pg_session.py``). The reflection and the target's shape are read in
one transaction on MySQL and MariaDB, after the target's metadata lock: an
``ALTER`` of the table cannot land between them (``shape.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from reconcile.core.contract import ConfigurationError
from reconcile.core.keys import float_key_error
from sinks.objects.sql_state import create_sql_state

from .errors import describe_error
from .pg_session import pin_postgres_sessions
from .sessions import SESSION_DIALECTS, pin_settings
from .shape import TargetShape, bind_problems, lock_target, read_shape

__all__ = ["open_engine", "reflect_target"]

_NO_SUCH_TABLE = 1146  # ER_NO_SUCH_TABLE


def open_engine(url: str, sink: str) -> sa.Engine:
    """The SQLAlchemy engine of ``url``, its MySQL and MariaDB sessions pinned (``sessions.py``).

    Raises:
        ConfigurationError: not an SQLAlchemy URL, or its driver is not
            installed (naming the extra); the password is never shown.
    """
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        # SQLAlchemy's message quotes the whole string, password included.
        raise ConfigurationError(
            f"sql sink {sink!r}: not an SQLAlchemy URL (dialect+driver://...); the string "
            "is not shown: it may hold a password"
        ) from None
    if "@" in (parsed.host or ""):
        raise ConfigurationError(
            f"sql sink {sink!r}: the URL's host holds an '@', so a user name or password "
            "in it has an '@' that is not percent-encoded; write it as %40. The URL is not "
            "shown: it may hold a password"
        )
    try:
        engine = sa.create_engine(parsed)
    except (sa.exc.ArgumentError, ImportError) as err:
        extra = "mariadb" if parsed.get_backend_name() in ("mysql", "mariadb") else "sql"
        what = f"cannot use the URL (pip install 'reconcile-engine[{extra}]')"
        raise ConfigurationError(describe_error(sink, url, what, err)) from None
    pin_settings(engine)  # strict sql_mode, UTC, every row read, ...
    pin_postgres_sessions(engine)  # PostgreSQL's: a role's DateStyle etc. change nothing read
    return engine


def _missing(err: sa.exc.DBAPIError) -> bool:
    return getattr(err.orig, "args", (None,))[0] == _NO_SUCH_TABLE


def reflect_target(
    engine: sa.Engine,
    url: str,
    sink: str,
    where: tuple[str | None, str],
    key: Sequence[str] | None,
    metadata: sa.MetaData,
) -> tuple[sa.Table, TargetShape | None]:
    """The target ``where`` (schema, table) reflected, and its shape on MySQL and MariaDB.

    The sink's own tables (``metadata``) are created if missing, and checked.

    Raises:
        ConfigurationError: the database cannot be reached; the table is
            missing, has no key, a float key, a key that takes distinct values
            for one, or an engine that does not roll back.
    """
    schema, name = where
    shown = f"{schema}.{name}" if schema else name
    try:
        with engine.connect() as conn:
            shape = None
            if engine.dialect.name in SESSION_DIALECTS:
                lock_target(conn, schema, name)
            table = sa.Table(name, sa.MetaData(schema=schema), autoload_with=conn)
            if engine.dialect.name in SESSION_DIALECTS:
                shape = read_shape(conn, schema, name)
        create_sql_state(engine, metadata, sink)  # checked
    except sa.exc.NoSuchTableError:
        raise ConfigurationError(
            f"sql sink {sink!r}: target table {name!r} does not exist"
        ) from None
    except sa.exc.DBAPIError as err:
        if _missing(err):
            raise ConfigurationError(
                f"sql sink {sink!r}: target table {shown!r} does not exist"
            ) from None
        raise ConfigurationError(describe_error(sink, url, "start-up check failed", err)) from None
    except sa.exc.SQLAlchemyError as err:
        raise ConfigurationError(describe_error(sink, url, "start-up check failed", err)) from None
    keys = list(key) if key else [c.name for c in table.primary_key.columns]
    if not keys:
        raise ConfigurationError(
            f"sql sink {sink!r}: table {name!r} has no primary key; give key=(...)"
        )
    for column in keys:
        # sa.Float covers REAL, DOUBLE PRECISION and FLOAT in every dialect.
        if column in table.c and isinstance(table.c[column].type, sa.Float):
            raise float_key_error(
                f"sql sink {sink!r}: table {name!r}",
                column,
                str(table.c[column].type),
                ConfigurationError,
            )
    problems = [] if shape is None else bind_problems(shape, keys)
    if problems:
        raise ConfigurationError(
            f"sql sink {sink!r}: cannot use table {shown}: {'; '.join(problems)}. Nothing "
            "was written"
        )
    return table, shape
