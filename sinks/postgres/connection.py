"""Connection targets for the Postgres sink: DSN / SQLAlchemy URL parsing and password redaction."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from reconcile.contract import ConfigurationError

__all__ = ["PgTarget", "redact_text"]

REDACTED = "***"

# postgresql+psycopg://, postgresql+psycopg2://, postgres+asyncpg://: the
# SQLAlchemy dialect+driver prefix. libpq understands only the bare scheme.
_SQLALCHEMY_SCHEME = re.compile(r"^(postgresql|postgres)\+[A-Za-z0-9_]+://")
_URI_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*(@)")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redact_text(text: str, password: str | None = None) -> str:
    """Remove a password from ``text``: its literal value and any DSN-shaped occurrence.

    Used on every message this package logs or raises, including messages that
    come from libpq or the server, which may echo a connection string.
    """
    if password:
        for variant in {password, quote(password, safe=""), quote(password)}:
            text = text.replace(variant, REDACTED)
    text = _URI_PASSWORD.sub(rf"\g<1>{REDACTED}\g<2>", text)
    return _KV_PASSWORD.sub(rf"\g<1>{REDACTED}", text)


@dataclass(frozen=True)
class PgTarget:
    """Where a sink connects: libpq parameters, with the password kept out of every repr.

    Build it with :meth:`parse` from a libpq DSN (``host=... dbname=...``), a
    libpq URI (``postgresql://user:pw@host/db``) or an SQLAlchemy URL
    (``postgresql+psycopg://...``).
    """

    params: dict[str, str]
    password: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, dsn: str | PgTarget) -> PgTarget:
        """Parse a DSN or URL.

        Raises:
            ConfigurationError: if it is not a connection string; the message
                never contains the password.
        """
        if isinstance(dsn, PgTarget):
            return dsn
        if not isinstance(dsn, str) or not dsn.strip():
            raise ConfigurationError(
                f"postgres sink: connection must be a non-empty DSN or URL string, "
                f"got {type(dsn).__name__}"
            )
        text = _SQLALCHEMY_SCHEME.sub("postgresql://", dsn.strip(), count=1)
        try:
            params = {k: str(v) for k, v in conninfo_to_dict(text).items() if v is not None}
        except psycopg.Error as err:
            raise ConfigurationError(
                "postgres sink: cannot parse connection string "
                f"{redact_text(text)!r}: {redact_text(str(err))}"
            ) from None
        password = params.pop("password", None)
        if password is not None and "://" in text:
            password = unquote(password)
        return cls(params=params, password=password)

    def conninfo(self, **overrides: Any) -> str:
        """The libpq conninfo string, password included: pass it to libpq only, never print it."""
        params: dict[str, Any] = dict(self.params)
        if self.password is not None:
            params["password"] = self.password
        params.update({k: v for k, v in overrides.items() if v is not None})
        return make_conninfo(**params)

    def describe(self) -> str:
        """``user@host:port/dbname``: safe to log and to put in errors."""
        user = self.params.get("user", "")
        host = self.params.get("host", "") or self.params.get("hostaddr", "") or "localhost"
        port = self.params.get("port", "")
        dbname = self.params.get("dbname", "")
        return f"{user + '@' if user else ''}{host}{':' + port if port else ''}/{dbname}"

    def redact(self, text: str) -> str:
        """``text`` with this target's password removed."""
        return redact_text(text, self.password)

    def connect(self, *, autocommit: bool = False, **overrides: Any) -> psycopg.Connection[Any]:
        """Open a connection.

        Raises:
            psycopg.OperationalError: with the password redacted from its message.
        """
        try:
            return psycopg.connect(self.conninfo(**overrides), autocommit=autocommit)
        except psycopg.Error as err:
            raise type(err)(self.redact(str(err))) from None

    def __repr__(self) -> str:
        shown = dict(self.params)
        if self.password is not None:
            shown["password"] = REDACTED
        return f"PgTarget({shown!r})"

    __str__ = describe
