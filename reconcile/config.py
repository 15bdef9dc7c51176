"""The config file: pipelines, their sink tables, the expected-state store, metrics and logs.

A TOML file (``examples/reconcile.toml`` is a complete, commented example)
loads into a frozen, typed model with :func:`load_config`. Every error names
the file and the key (``reconcile.toml: pipelines.orders.sinks.lines.table:
expected a string, got int``); unknown keys are refused, with the known ones
listed. Secrets come from the environment (``password_env = "PG_PASSWORD"``,
or ``${VAR}`` anywhere in a DSN or URL) and never appear in a repr or an error:
a connection shows itself as written in the file, password removed.

Relative paths are taken from the config file's folder.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from reconcile.contract import ConfigurationError, validate_name
from reconcile.logs import scrub

__all__ = [
    "Config",
    "ConfigFileError",
    "Connection",
    "LogSettings",
    "MetricsSettings",
    "PipelineConfig",
    "SinkTableConfig",
    "load_config",
]

VERIFY_MODES = ("auto", "full", "scoped", "buckets")
WRITE_MODES = ("transactional", "prepared")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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

    def redact(self, text: str) -> str:
        """``text`` without this connection's secrets (and anything password-shaped)."""
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return scrub(text)

    def __str__(self) -> str:
        suffix = f" (password from ${self.password_env})" if self.password_env else ""
        return self.display + suffix

    def __repr__(self) -> str:
        return f"Connection({self.kind}={str(self)!r})"


@dataclass(frozen=True)
class SinkTableConfig:
    """One sink table of a pipeline: where it is, its keys, how it is written and verified.

    Attributes:
        pipeline: the pipeline's name.
        name: the sink's name (its key under ``sinks``).
        connection: the database (a DSN or an SQLAlchemy URL).
        table: the table, ``name`` or ``schema.name``.
        keys: the key columns, in order.
        mode: the verify/repair mode (auto, full, scoped, buckets).
        write_mode: the Postgres sink's commit mode (transactional, prepared).
        store: the expected-state store root of its pipeline.
        progress: the progress log folder of its pipeline, if given.
    """

    pipeline: str
    name: str
    connection: Connection
    table: str
    keys: tuple[str, ...]
    mode: str
    write_mode: str
    store: str
    progress: Path | None


@dataclass(frozen=True)
class PipelineConfig:
    """A pipeline: its sink tables (in file order), its store root and its progress log."""

    name: str
    store: str
    progress: Path | None
    sinks: tuple[SinkTableConfig, ...]

    def sink(self, name: str) -> SinkTableConfig:
        """The sink table ``name``.

        Raises:
            ConfigurationError: no such sink (the message lists the sinks).
        """
        for sink in self.sinks:
            if sink.name == name:
                return sink
        raise ConfigurationError(
            f"pipeline {self.name!r} has no sink {name!r}; it has {[s.name for s in self.sinks]}"
        )


@dataclass(frozen=True)
class MetricsSettings:
    """Where metrics go: an HTTP port (``port``, ``addr``) or a textfile (``textfile``)."""

    port: int | None = None
    addr: str = "127.0.0.1"
    textfile: Path | None = None
    interval_s: float = 15.0  # how often the textfile is rewritten


@dataclass(frozen=True)
class LogSettings:
    """How the engine logs: JSON lines or text, and the level."""

    json: bool = False
    level: str = "INFO"


@dataclass(frozen=True)
class Config:
    """A loaded config file."""

    path: Path
    pipelines: tuple[PipelineConfig, ...]
    metrics: MetricsSettings | None = None
    logs: LogSettings = field(default_factory=LogSettings)

    def pipeline(self, name: str) -> PipelineConfig:
        """The pipeline ``name``.

        Raises:
            ConfigurationError: no such pipeline (the message lists them).
        """
        for pipeline in self.pipelines:
            if pipeline.name == name:
                return pipeline
        raise ConfigurationError(
            f"{self.path}: no pipeline {name!r}; it has {[p.name for p in self.pipelines]}"
        )

    def tables(self, pipeline: str | None = None) -> Iterator[SinkTableConfig]:
        """Every sink table of every pipeline (or of ``pipeline``), in file order."""
        for p in self.pipelines if pipeline is None else (self.pipeline(pipeline),):
            yield from p.sinks


# ----------------------------------------------------------------------- loading


class _Reader:
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

    def table(self, key: str) -> _Reader | None:
        value = self.get(key, dict)
        return None if value is None else _Reader(self.file, self.key(key), value)

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


def load_config(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Config:
    """Read and check a config file; fill in secrets from the environment.

    Args:
        path: the TOML file.
        env: where ``password_env`` and ``${VAR}`` are looked up (default: os.environ).

    Returns:
        The frozen model.

    Raises:
        ConfigFileError: unreadable, not TOML, a wrong type or value, an unknown
            key, or a variable that is not set; the message names the file and
            the key, never a secret.
    """
    file = Path(path)
    environ = os.environ if env is None else env
    try:
        with file.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as err:
        raise ConfigFileError(f"{file}: cannot read: {err.strerror}", file=str(file)) from None
    except tomllib.TOMLDecodeError as err:
        # tomllib's message gives the line and column, never the text there.
        raise ConfigFileError(f"{file}: not valid TOML: {err}", file=str(file)) from None
    top = _Reader(file, "", data)
    top.only("store", "metrics", "logs", "pipelines")
    base = file.parent
    store = top.table("store")
    default_store = _store_root(store, base) if store else None
    if store:
        store.done()
    metrics = _metrics(top.table("metrics"), base)
    logs = _logs(top.table("logs"))
    pipelines_table = top.table("pipelines")
    top.done()
    if pipelines_table is None or not pipelines_table.data:
        raise top.error("at least one pipeline is required ([pipelines.NAME])", "pipelines")
    pipelines = tuple(
        _pipeline(pipelines_table, name, default_store, base, environ)
        for name in list(pipelines_table.data)
    )
    return Config(file, pipelines, metrics, logs)


def _path(value: str, base: Path) -> str:
    """A local path taken from the config's folder; a URI (``s3://...``) as it is."""
    return value if "://" in value else str((base / value).resolve())


def _store_root(store: _Reader, base: Path) -> str:
    store.only("root")
    root = store.get("root", str, required=True)
    if not root:
        raise store.error("must not be empty", "root")
    return _path(root, base)


def _name(reader: _Reader, what: str, name: str) -> str:
    try:
        return validate_name(what, name)
    except ConfigurationError as err:
        raise reader.error(str(err), name) from None


def _pipeline(
    pipelines: _Reader, name: str, store: str | None, base: Path, env: Mapping[str, str]
) -> PipelineConfig:
    _name(pipelines, "pipeline", name)
    reader = pipelines.table(name)
    assert reader is not None
    reader.only("store", "progress", "sinks")
    own_store = reader.get("store", str)
    root = _path(own_store, base) if own_store else store
    if root is None:
        raise reader.error("no expected-state store: set [store] root, or store here", "store")
    progress_text = reader.get("progress", str)
    progress = Path(_path(progress_text, base)) if progress_text else None
    sinks_table = reader.table("sinks")
    reader.done()
    if sinks_table is None or not sinks_table.data:
        raise reader.error("at least one sink table is required ([...sinks.NAME])", "sinks")
    sinks = []
    for sink_name in list(sinks_table.data):
        _name(sinks_table, "sink", sink_name)
        sink = sinks_table.table(sink_name)
        assert sink is not None
        sinks.append(_sink(sink, name, sink_name, root, progress, env))
    sinks_table.done()
    return PipelineConfig(name, root, progress, tuple(sinks))


def _sink(
    reader: _Reader,
    pipeline: str,
    name: str,
    store: str,
    progress: Path | None,
    env: Mapping[str, str],
) -> SinkTableConfig:
    reader.only("dsn", "url", "password_env", "table", "keys", "mode", "write_mode")
    connection = _connection(reader, env)
    table = reader.get("table", str, required=True)
    if not table.strip():
        raise reader.error("must not be empty", "table")
    keys = reader.get("keys", list, required=True)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise reader.error("expected a non-empty array of column names", "keys")
    if len(set(keys)) != len(keys):
        raise reader.error(f"a key column is listed twice: {keys}", "keys")
    mode = _choice(reader, "mode", VERIFY_MODES, "auto")
    write_mode = _choice(reader, "write_mode", WRITE_MODES, "transactional")
    reader.done()
    return SinkTableConfig(
        pipeline, name, connection, table, tuple(keys), mode, write_mode, store, progress
    )


def _choice(reader: _Reader, key: str, choices: tuple[str, ...], default: str) -> str:
    value = reader.get(key, str)
    if value is None:
        return default
    if value not in choices:
        raise reader.error(f"expected one of {list(choices)}, got {value!r}", key)
    return str(value)


def _connection(reader: _Reader, env: Mapping[str, str]) -> Connection:
    dsn, url = reader.get("dsn", str), reader.get("url", str)
    password_env = reader.get("password_env", str)
    if (dsn is None) == (url is None):
        raise reader.error(
            "give exactly one of dsn (a libpq DSN or postgresql:// URI) or url (an SQLAlchemy URL)",
            None,
        )
    key, template = ("dsn", dsn) if dsn is not None else ("url", url)
    secrets: list[str] = []

    def fill(match: re.Match[str]) -> str:
        variable = match[1]
        if variable not in env:
            raise reader.error(f"environment variable {variable} is not set", key)
        # Any variable may hold a secret: each value is redacted from messages.
        secrets.append(env[variable])
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
    value = _with_password(reader, key, value, password, secrets)
    kind: Literal["dsn", "url"] = "dsn" if key == "dsn" else "url"
    return Connection(kind, scrub(template), password_env, value, tuple(s for s in secrets if s))


def _with_password(
    reader: _Reader, key: str, value: str, password: str | None, secrets: list[str]
) -> str:
    """Check the DSN or URL parses; put ``password`` in it (structurally, so no escaping)."""
    if key == "dsn":
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
        if parsed.get("password"):
            secrets.append(str(parsed["password"]))
        return value
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(value)
    except ArgumentError:
        raise reader.error("not a valid SQLAlchemy URL (dialect+driver://...)", key) from None
    if url.password:
        secrets.append(str(url.password))
    if password is None:
        return value
    return url.set(password=password).render_as_string(hide_password=False)


def _metrics(reader: _Reader | None, base: Path) -> MetricsSettings | None:
    if reader is None:
        return None
    reader.only("port", "addr", "textfile", "interval_s")
    port = reader.get("port", int)
    addr = reader.get("addr", str)
    textfile = reader.get("textfile", str)
    interval = reader.get("interval_s", (int, float))
    reader.done()
    if (port is None) == (textfile is None):
        raise reader.error("give exactly one of port or textfile", None)
    if port is not None and not 0 <= port <= 65535:
        raise reader.error(f"expected a port number 0..65535, got {port}", "port")
    if textfile is not None and not textfile.endswith(".prom"):
        raise reader.error("must end in .prom (node_exporter reads only those)", "textfile")
    if interval is not None and interval <= 0:
        raise reader.error(f"must be > 0, got {interval}", "interval_s")
    return MetricsSettings(
        port=port,
        addr=addr or "127.0.0.1",
        textfile=Path(_path(textfile, base)) if textfile is not None else None,
        interval_s=float(interval) if interval is not None else 15.0,
    )


def _logs(reader: _Reader | None) -> LogSettings:
    if reader is None:
        return LogSettings()
    reader.only("json", "level")
    as_json = reader.get("json", bool)
    level = reader.get("level", str)
    reader.done()
    if level is not None and level.upper() not in LEVELS:
        raise reader.error(f"expected one of {list(LEVELS)}, got {level!r}", "level")
    return LogSettings(json=bool(as_json), level=(level or "INFO").upper())
