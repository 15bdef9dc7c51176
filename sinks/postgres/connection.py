"""Postgres connection targets: DSN / SQLAlchemy URL parsing, secrets, connect errors."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from reconcile.core.contract import ConfigurationError, ReconcileError, RetryableError
from reconcile.core.redaction import REDACTED, redact

__all__ = ["SECRET_PARAMS", "SESSION_SETTINGS", "PgTarget", "connect_failure", "redact_text"]


# libpq parameters whose values are secrets: kept out of ``params`` (and so out
# of every repr), and redacted from every message by literal value.
SECRET_PARAMS = ("password", "sslpassword")

# The settings every session of the engine pins, whatever the server, database or
# role says (ALTER ROLE/DATABASE ... SET): what is read and written as text must
# not depend on them. DateStyle decides how psycopg parses a date or timestamp
# the server sends as text (it cannot parse 'SQL, DMY'); TimeZone how a
# timestamptz reads and what a timestamp literal means; IntervalStyle how an
# interval reads; extra_float_digits whether a float8 read as text round-trips
# (below 1 it is rounded); bytea_output how a bytea reads as text;
# standard_conforming_strings whether a backslash in a literal is an escape.
# They go into the startup packet's options, which take precedence over every
# per-role and per-database default, so no extra round trip is needed and no
# connection, however it is opened, runs without them. A user's own options
# come first: ours come last and win.
SESSION_SETTINGS: tuple[tuple[str, str], ...] = (
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("TimeZone", "UTC"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
    ("standard_conforming_strings", "on"),
)
_SESSION_OPTIONS = " ".join(
    f"-c {name}={value.replace(' ', '')}" for name, value in SESSION_SETTINGS
)

# postgresql+psycopg://, postgresql+psycopg2://, postgres+asyncpg://: the
# SQLAlchemy dialect+driver prefix. libpq understands only the bare scheme.
_SQLALCHEMY_SCHEME = re.compile(r"^(postgresql|postgres)\+[A-Za-z0-9_]+://")
# What libpq quotes of the string it could not parse: a fragment of the
# string, maybe of its password. Single characters ("=") are kept.
_QUOTED = re.compile(r'"([^"]*)"')

# Server answers to a connection attempt that no retry can fix: libpq reports
# them as text only (no SQLSTATE reaches the client before the session
# exists), so they are recognised by the server's (English) message. A server
# with another lc_messages gives other words: those failures are then
# classified as retryable, which is safe (retried, never guessed), only slower.
_TERMINAL_CONNECT = re.compile(
    r"password authentication failed|authentication failed for user|"
    r"role \"[^\"]*\" does not exist|database \"[^\"]*\" does not exist|"
    r"no pg_hba\.conf entry|no password supplied|password is required|"
    r"is not permitted to log in|permission denied for database|"
    r"invalid (?:connection option|sslmode value|port number)|"
    r"server does not support SSL|"
    # A setting in the DSN's options that the server refuses at every start-up.
    r"invalid value for parameter|unrecognized configuration parameter|"
    r"parameter \"[^\"]*\" cannot be (?:changed|set)|outside the valid range for parameter",
    re.IGNORECASE,
)


def redact_text(text: str, *secrets: str | None) -> str:
    """Remove secrets from ``text``: their values and any secret-shaped part.

    Used on every message this package logs or raises, including messages that
    come from libpq or the server, which may echo a connection string. The one
    redaction of the core (``reconcile.core.redaction.redact``): each secret in
    every form text gives it (percent-encoded, escaped, base64), then every
    URI password and secret-named parameter.
    """
    return redact(text, *secrets)


@dataclass(frozen=True)
class PgTarget:
    """Where a sink connects: libpq parameters, with the secrets kept out of every repr.

    Build it with :meth:`parse` from a libpq DSN (``host=... dbname=...``), a
    libpq URI (``postgresql://user:pw@host/db``) or an SQLAlchemy URL
    (``postgresql+psycopg://...``).
    """

    params: dict[str, str]
    password: str | None = field(default=None, repr=False, compare=False)
    secrets: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, dsn: str | PgTarget) -> PgTarget:
        """Parse a DSN or URL.

        Raises:
            ConfigurationError: if it is not a connection string; the message
                never contains a secret.
        """
        if isinstance(dsn, PgTarget):
            return dsn
        if not isinstance(dsn, str) or not dsn.strip():
            raise ConfigurationError(
                f"postgres sink: connection must be a non-empty DSN or URL string, "
                f"got {type(dsn).__name__}"
            )
        text = _SQLALCHEMY_SCHEME.sub("postgresql://", dsn.strip(), count=1)
        form = "a postgresql:// URI" if "://" in text else "key=value pairs"
        try:
            # libpq's own parser: it percent-decodes a URI's user info and
            # query once, which is all the decoding there is. Decoding again
            # here would turn a literal '%41' in a password into 'A'.
            params = {k: str(v) for k, v in conninfo_to_dict(text).items() if v is not None}
        except psycopg.Error as err:
            # Neither the string nor what libpq quotes of it is shown: a string
            # libpq cannot parse is one whose password the redaction patterns
            # cannot find either (a space, a stray '%', an open quote).
            reason = _QUOTED.sub(lambda m: m[0] if len(m[1]) <= 1 else '"..."', str(err).strip())
            raise ConfigurationError(
                f"postgres sink: cannot parse the connection string ({form}): {reason}. "
                "The string is not shown: it may hold a password"
            ) from None
        for key in ("host", "hostaddr", "port"):
            if "@" in params.get(key, ""):
                # libpq took the user info up to the first '@': the rest of a
                # password (or user name) with an '@' in it became the host,
                # and would be shown wherever the host is.
                raise ConfigurationError(
                    f"postgres sink: cannot use the connection string ({form}): its {key} "
                    "holds an '@', so a user name or password in it has an '@' that is not "
                    "percent-encoded; write it as %40. The string is not shown: it may hold "
                    "a password"
                )
        secrets = {k: params.pop(k) for k in SECRET_PARAMS if k in params}
        return cls(params=params, password=secrets.get("password"), secrets=secrets)

    def conninfo(self, **overrides: Any) -> str:
        """The libpq conninfo string, secrets included: pass it to libpq only, never print it."""
        params: dict[str, Any] = dict(self.params)
        params.update(self._all_secrets())
        params.update({k: v for k, v in overrides.items() if v is not None})
        params["options"] = f"{params.get('options') or ''} {_SESSION_OPTIONS}".strip()
        return make_conninfo(**params)

    def _all_secrets(self) -> dict[str, str]:
        found = dict(self.secrets)
        if self.password is not None:
            found["password"] = self.password
        return found

    def describe(self) -> str:
        """``user@host:port/dbname``: safe to log and to put in errors."""
        user = self.params.get("user", "")
        host = self.params.get("host", "") or self.params.get("hostaddr", "") or "localhost"
        port = self.params.get("port", "")
        dbname = self.params.get("dbname", "")
        return f"{user + '@' if user else ''}{host}{':' + port if port else ''}/{dbname}"

    def redact(self, text: str) -> str:
        """``text`` with this target's secrets removed."""
        return redact_text(text, *self._all_secrets().values())

    def connect(self, *, autocommit: bool = False, **overrides: Any) -> psycopg.Connection[Any]:
        """Open a connection.

        Raises:
            psycopg.OperationalError: with the secrets redacted from its message
                (and without the failed connection object, which holds them).
        """
        try:
            return psycopg.connect(self.conninfo(**overrides), autocommit=autocommit)
        except psycopg.Error as err:
            raise type(err)(self.redact(str(err))) from None

    def __repr__(self) -> str:
        shown = dict(self.params)
        for key in self._all_secrets():
            shown[key] = REDACTED
        return f"PgTarget({shown!r})"

    __str__ = describe


def connect_failure(target: PgTarget, err: psycopg.Error, what: str) -> ReconcileError:
    """Sort a failed connection attempt: wrong credentials or names are terminal.

    Args:
        target: where the attempt went (for the message; secrets redacted).
        err: the error libpq raised.
        what: who tried, e.g. "postgres sink 'orders'".

    Returns:
        ConfigurationError for a wrong password, an unknown role or database,
        a pg_hba.conf refusal, a bad option or a setting in the options the
        server refuses (no retry can fix them);
        RetryableError for everything else (the server is down, starting,
        restarting, out of connection slots, unreachable): a failure that a
        retry may cure, which the message leaves to the caller to promise.
    """
    text = target.redact(str(err)).strip()
    if _TERMINAL_CONNECT.search(text):
        return ConfigurationError(
            f"{what}: cannot connect to {target.describe()}: {text}. Fix the connection "
            "settings (user, password, database, pg_hba.conf, options); retrying cannot help",
            target=target.describe(),
        )
    # No promise to retry here: whether anyone retries is the caller's to say
    # (the pipeline's driver logs each retry; a one-off command says it does not).
    return RetryableError(
        f"{what}: cannot reach {target.describe()}: {text}",
        target=target.describe(),
    )
