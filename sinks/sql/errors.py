"""How the SQL sink speaks of failures: the URL without its password, the SQLSTATE, a rejection."""

from __future__ import annotations

import re

import sqlalchemy as sa

from reconcile.core.contract import Fatal, RejectedError, Retryable, SinkOutcome, SinkTxnId
from reconcile.core.decisions import is_rejection_sqlstate
from reconcile.core.redaction import is_secret_name, redact_uri
from reconcile.core.redaction import redact as core_redact

__all__ = [
    "describe_error",
    "prepare_failure",
    "redact",
    "redact_url",
    "rejection",
    "sqlstate_of",
]

# What MySQL and MariaDB name in a refusal's message (they send no separate
# column or constraint): "... for column 'v' at row 1", "... for column
# `db`.`t`.`v` at row 1", "Column 'v' cannot be null", "CONSTRAINT `c` failed
# for `db`.`t`", "Duplicate entry '...' for key 'PRIMARY'".
_MYSQL_COLUMN = re.compile(r"[Cc]olumn (?:[`'][^`']*[`']\.)*[`']([^`']+)[`']")
_MYSQL_CONSTRAINT = re.compile(r"CONSTRAINT [`']([^`']+)[`'] failed|for key [`']([^`']+)[`']")


def _named_by_mysql(said: str) -> tuple[str | None, str | None]:
    """(constraint, column) that a MySQL or MariaDB error message names, if any."""
    constraint = _MYSQL_CONSTRAINT.search(said)
    column = _MYSQL_COLUMN.search(said)
    return (
        None if constraint is None else constraint.group(1) or constraint.group(2),
        None if column is None else column.group(1),
    )


def redact_url(url: str) -> str:
    """The URL with its password hidden (for every message)."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        return "<unparsable URL>"
    if "@" in (parsed.host or ""):
        # The user info was cut at its first '@': the rest of a password with an
        # unencoded '@' became the host. Nothing of it is shown.
        return f"{parsed.drivername}://<user info with an unencoded '@'>"
    # The core's redaction on top: a secret-named query parameter (a mistyped
    # sink scheme lands here, with its credential= or secret-access-key=).
    return redact_uri(parsed.render_as_string(hide_password=True))


def sqlstate_of(err: BaseException) -> str:
    """The SQLSTATE a DB-API error carries (psycopg: ``sqlstate``, psycopg2: ``pgcode``), or ""."""
    orig = getattr(err, "orig", None)
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return state if isinstance(state, str) else ""


def redact(url: str, text: str) -> str:
    """``text`` without the URL's secrets: its password and secret-named parameters'
    values (in every form, ``reconcile.core.redaction``), and any secret shape."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        return core_redact(text)
    secrets = [parsed.password] + [
        str(v) for k, vs in parsed.query.items() if is_secret_name(k)
        for v in ((vs,) if isinstance(vs, str) else vs)
    ]  # fmt: skip
    return core_redact(text, *(str(s) for s in secrets if s))


def describe_error(name: str, url: str, what: str, err: BaseException) -> str:
    """A failure of sink ``name``: what failed, on which URL, and why; no password in it."""
    return redact(url, f"sql sink {name!r} ({redact_url(url)}): {what}: {err}")


def rejection(
    err: sa.exc.StatementError, *, epoch: int, table: str, sink: str, url: str
) -> RejectedError:
    """The typed cause of the database's refusal of an epoch's rows (a constraint, a value).

    SQLAlchemy's IntegrityError and DataError are the DB-API's, whatever
    the driver; a driver that gives a SQLSTATE (psycopg, and the
    constraint and column with it) gets it named, as the Postgres sink does;
    MySQL's and MariaDB's are read from the message.
    """
    orig = getattr(err, "orig", None)
    diag = getattr(orig, "diag", None)
    said = str(orig if orig is not None else err).strip().splitlines()
    reason = redact(url, said[0] if said else type(err).__name__)
    constraint, column = _named_by_mysql(reason) if diag is None else (None, None)
    return RejectedError.of(
        epoch=epoch,
        table=table,
        sqlstate=sqlstate_of(err),
        reason=reason,
        sink=sink,
        constraint=getattr(diag, "constraint_name", None) or constraint,
        column=getattr(diag, "column_name", None) or column,
    )


def prepare_failure(
    err: sa.exc.SQLAlchemyError, txn: SinkTxnId, *, table: str, sink: str, url: str
) -> SinkOutcome:
    """What a prepare of ``txn`` that failed with ``err`` returns; nothing of it was written.

    The cases:

    - a definite refusal by the database (a value, a constraint such as a
      CHECK, NOT NULL or a unique key, a privilege: a DataError or IntegrityError,
      or a rejecting SQLSTATE, ``reconcile.core.decisions``) stops the
      pipeline, naming the table and what the database named;
    - a lock wait that ran out, a deadlock, a lost connection (OperationalError
      of any other SQLSTATE, or no statement at all) is tried again;
    - anything else a statement raised (a bug, a table that changed) stops it.
    """
    said = describe_error(sink, url, f"prepare({txn}) refused; nothing was written", err)
    if isinstance(err, sa.exc.StatementError) and (
        isinstance(err, sa.exc.DataError | sa.exc.IntegrityError)
        or is_rejection_sqlstate(sqlstate_of(err))
    ):
        return Fatal(said, rejection(err, epoch=txn.epoch, table=table, sink=sink, url=url))
    if isinstance(err, sa.exc.OperationalError) or not isinstance(err, sa.exc.StatementError):
        return Retryable(describe_error(sink, url, f"prepare({txn}); nothing was written", err))
    return Fatal(said)
