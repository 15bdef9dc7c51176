"""Reading a config file's TOML tables strictly: types, unknown keys, paths, names, connections.

The parts of :mod:`reconcile.cli.config` that every table's parser shares: a
:class:`TableReader` takes keys by type and refuses the ones left over, with
every error naming the file and the key (never a value that may be a secret);
:func:`read_connection` turns ``dsn`` / ``url`` / ``password_env`` into a
:class:`Connection` with its secrets filled in from the environment.
:mod:`reconcile.cli.config` re-exports ``ConfigFileError`` and ``Connection``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from reconcile.core.contract import ConfigurationError, validate_name
from reconcile.core.redaction import is_secret_name, redact, scrub

__all__ = [
    "ConfigFileError",
    "Connection",
    "TableReader",
    "check_name",
    "choice",
    "fill_connection",
    "local_path",
    "read_connection",
]

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class ConfigFileError(ConfigurationError):
    """A config file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Connection:
    """A libpq DSN (``kind="dsn"``) or an SQLAlchemy URL (``kind="url"``) with its secrets.

    ``str()`` and ``repr()`` show it as the file wrote it (``${VAR}`` kept, a
    literal password replaced by ***); :meth:`get_secret_value` gives the
    string to connect with. :meth:`redact` takes the secrets out of a message
    (e.g. a driver error that echoes the connection string).
    """

    kind: Literal["dsn", "url"]
    display: str
    password_env: str | None = None
    _value: str = field(default="", repr=False, compare=False)
    _secrets: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def get_secret_value(self) -> str:
        """The DSN or URL with every variable and the password filled in."""
        return self._value

    def secrets(self) -> tuple[str, ...]:
        """The secret values in it (a password, every variable's value): to redact with."""
        return self._secrets

    def redact(self, text: str) -> str:
        """``text`` without this connection's secrets, in every form text gives them
        (percent-encoded, escaped as repr or JSON, base64), nor any secret shape."""
        return redact(text, *self._secrets)

    def __str__(self) -> str:
        suffix = f" (password from ${self.password_env})" if self.password_env else ""
        return self.display + suffix

    def __repr__(self) -> str:
        return f"Connection({self.kind}={str(self)!r})"


class TableReader:
    """One TOML table being read: takes keys by type, then refuses the keys left over."""

    def __init__(self, file: Path, where: str, data: object) -> None:
        self.file, self.where = file, where
        if not isinstance(data, dict):
            raise self.error(f"expected a table, got {_kind(data)}", key=None)
        self.data: dict[str, Any] = data
        self.taken: set[str] = set()

    def error(self, problem: str, key: str | None) -> ConfigFileError:
        at = ".".join(p for p in (self.where, key) if p) or "(top level)"
        return ConfigFileError(f"{self.file}: {at}: {problem}", file=str(self.file), key=at)

    def get(self, key: str, kind: type | tuple[type, ...], *, required: bool = False) -> Any:
        self.taken.add(key)
        if key not in self.data:
            if required:
                raise self.error("is required", key)
            return None
        value = self.data[key]
        # bool is an int in Python; a port or a count given as true is a mistake.
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _tuple(kind)):
            names = " or ".join(_NAMES.get(k, k.__name__) for k in _tuple(kind))
            # Only the type of a wrong value is shown: it may be a secret.
            raise self.error(f"expected {names}, got {_kind(value)}", key)
        return value

    def table(self, key: str) -> TableReader | None:
        value = self.get(key, dict)
        return None if value is None else TableReader(self.file, self.key(key), value)

    def key(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def only(self, *known: str) -> None:
        """Refuse any key but ``known`` (before reading: a typo is named, not "required")."""
        for key in self.data:
            if key not in known:
                near = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise self.error(f"unknown key{hint}; known: {sorted(known)}", key)

    def done(self) -> None:
        """Refuse the keys nothing read."""
        self.only(*self.taken)


_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "a table",
    list: "an array",
}


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind(value: object) -> str:
    return {
        bool: "bool",
        int: "int",
        float: "float",
        str: "string",
        dict: "table",
        list: "array",
    }.get(type(value), type(value).__name__)


def local_path(value: str, base: Path) -> str:
    """A local path taken from the config's folder; a URI (``s3://...``) as it is."""
    return value if "://" in value else str((base / value).resolve())


def check_name(reader: TableReader, what: str, name: str) -> str:
    """``name`` if it is a valid pipeline or sink name, else an error naming it as a key."""
    try:
        return validate_name(what, name)
    except ConfigurationError as err:
        raise reader.error(str(err), name) from None


def choice(reader: TableReader, key: str, choices: tuple[str, ...], default: str) -> str:
    """The string at ``key``, one of ``choices`` (``default`` when absent)."""
    value = reader.get(key, str)
    if value is None:
        return default
    if value not in choices:
        raise reader.error(f"expected one of {list(choices)}, got {value!r}", key)
    return str(value)


def read_connection(reader: TableReader, env: Mapping[str, str]) -> Connection:
    """A sink table's ``dsn`` or ``url`` (exactly one), with its ``password_env``."""
    dsn, url = reader.get("dsn", str), reader.get("url", str)
    password_env = reader.get("password_env", str)
    if (dsn is None) == (url is None):
        raise reader.error(
            "give exactly one of dsn (a libpq DSN or postgresql:// URI) or url (an SQLAlchemy "
            "URL, or a sink URI: iceberg://..., s3://...)",
            None,
        )
    if dsn is not None:
        return fill_connection(reader, "dsn", "dsn", dsn, password_env, env)
    return fill_connection(reader, "url", "url", url, password_env, env)


def fill_connection(
    reader: TableReader,
    key: str,
    kind: Literal["dsn", "url"],
    template: str,
    password_env: str | None,
    env: Mapping[str, str],
) -> Connection:
    """The connection written at ``key``: ``${VAR}`` and ``password_env`` filled in, checked.

    Errors name ``key`` (or ``password_env``), never the value: it may hold a secret.
    """
    secrets: list[str] = []
    user_info_end = _user_info_end(template)

    def fill(match: re.Match[str]) -> str:
        variable = match[1]
        if variable not in env:
            raise reader.error(f"environment variable {variable} is not set", key)
        # Any variable may hold a secret: each value is redacted from messages.
        secrets.append(env[variable])
        if match.start() < user_info_end:
            # Inside a URI's user info a value is percent-encoded: a password
            # with '@' or '/' would otherwise end the user info early, and its
            # tail would be read (and shown) as the host. ':' is kept: it parts
            # user from password (a variable may hold both), and a password's
            # own ':' after the first is read as part of it.
            return quote(env[variable], safe=":")
        return env[variable]

    value = _VAR.sub(fill, template)
    password = None
    if password_env is not None:
        if not _ENV_NAME.fullmatch(password_env):
            raise reader.error("expected the name of an environment variable", "password_env")
        if password_env not in env:
            raise reader.error(f"environment variable {password_env} is not set", "password_env")
        password = env[password_env]
        secrets.append(password)
    value = _with_password(reader, key, kind, value, password, secrets)
    return Connection(kind, scrub(template), password_env, value, tuple(s for s in secrets if s))


def _user_info_end(template: str) -> int:
    """Where the user info of a URI-form ``template`` ends (its last '@'); 0 if it has none.

    Read from the template, before any variable is filled in, so that an '@'
    inside a variable's value cannot move it.
    """
    scheme = _SCHEME.match(template)
    if scheme is None:
        return 0
    start = scheme.end()
    authority_end = len(template)
    for stop in "/?#":
        found = template.find(stop, start)
        if found != -1:
            authority_end = min(authority_end, found)
    at = template.rfind("@", start, authority_end)
    return max(at, 0)


def _with_password(
    reader: TableReader,
    key: str,
    kind: Literal["dsn", "url"],
    value: str,
    password: str | None,
    secrets: list[str],
) -> str:
    """Check the DSN or URL parses; put ``password`` in it (structurally, so no escaping)."""
    if kind == "dsn":
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        try:
            parsed = conninfo_to_dict(value)
            if password is not None:
                return make_conninfo(value, password=password)
        except ProgrammingError:
            # libpq's message quotes the text it choked on, which may be part
            # of a password: it is not shown.
            raise reader.error(
                "not a valid libpq connection string (key=value pairs, or a postgresql:// URI)",
                key,
            ) from None
        secrets.extend(str(v) for k, v in parsed.items() if v and is_secret_name(k))
        return value
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(value)
    except ArgumentError:
        raise reader.error(
            "not a valid URL (an SQLAlchemy URL, dialect+driver://..., or a sink URI, "
            "scheme://...)",
            key,
        ) from None
    if url.password:
        secrets.append(str(url.password))
    # A secret-named parameter's value (an Iceberg credential=, a
    # secret-access-key=) is a secret too, wherever a message shows it.
    for name, values in url.query.items():
        if is_secret_name(name):
            secrets.extend([values] if isinstance(values, str) else values)
    if password is None:
        return value
    return url.set(password=password).render_as_string(hide_password=False)
