"""The config file: pipelines, their sink tables, the expected-state store, metrics and logs.

A TOML file (``examples/reconcile.toml`` is a complete, commented example)
loads into a frozen, typed model with :func:`load_config`. Every error names
the file and the key (``reconcile.toml: pipelines.orders.sinks.lines.table:
expected a string, got int``); unknown keys are refused, with the known ones
listed. Secrets come from the environment (``password_env = "PG_PASSWORD"``,
or ``${VAR}`` anywhere in a DSN or URL) and never appear in a repr or an error:
a connection shows itself as written in the file, password removed.

Relative paths are taken from the config file's folder. The strict table
reader and the connection parsing live in :mod:`reconcile.cli.config_read`; a
pipeline's ``run`` table (how ``reconcile run`` streams it) in
:mod:`reconcile.cli.config_run`.
"""

from __future__ import annotations

import logging
import os
import stat
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from reconcile.cli.config_read import (
    ConfigFileError,
    Connection,
    TableReader,
    check_name,
    choice,
    local_path,
    read_connection,
)
from reconcile.cli.config_run import RunSettings, read_run
from reconcile.core.contract import ConfigurationError

# The store's own default (expected_state.housekeeping), restated: the CLI's
# config model imports nothing of the store to load a file.
DEFAULT_RETENTION_HOURS = 0
DEFAULT_SAFETY_MARGIN_MINUTES = 10.0

__all__ = [
    "Config",
    "ConfigFileError",
    "Connection",
    "LogSettings",
    "MetricsSettings",
    "PipelineConfig",
    "RunSettings",
    "SinkTableConfig",
    "load_config",
]

log = logging.getLogger("reconcile.config")

VERIFY_MODES = ("auto", "full", "scoped", "buckets")
WRITE_MODES = ("transactional", "prepared")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


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
        max_change_fraction: the repair's mass-change brake: the most of the
            table a repair may delete or change on its own (0 to 1, default 0.1).
        realtime: its pipeline runs under Real-Time Mode (``run.realtime``).
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
    max_change_fraction: float = 0.1
    realtime: bool = False


@dataclass(frozen=True)
class PipelineConfig:
    """A pipeline: its sink tables (in file order), its store root and its progress log.

    ``run`` is how ``reconcile run`` streams it (its ``run`` table), or None.
    ``store_retention_hours`` is how long its store's housekeeping keeps a file
    that no version it keeps references (``store_retention_hours``, else the
    ``[store]`` table's ``retention_hours``, else 0: only what the store keeps
    anyway); ``store_safety_margin_minutes`` keeps such a file written since (else
    the ``[store]`` table's ``safety_margin_minutes``, else 10); docs/configuration.md.
    """

    name: str
    store: str
    progress: Path | None
    sinks: tuple[SinkTableConfig, ...]
    run: RunSettings | None = None
    store_retention_hours: float = DEFAULT_RETENTION_HOURS
    store_safety_margin_minutes: float = DEFAULT_SAFETY_MARGIN_MINUTES

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

    def secrets(self) -> Iterator[str]:
        """Every secret value of the file's connections (sinks and leases): to redact with."""
        for p in self.pipelines:
            for connection in (
                *(s.connection for s in p.sinks),
                *((p.run.lease,) if p.run else ()),
            ):
                yield from connection.secrets()

    def tables(self, pipeline: str | None = None) -> Iterator[SinkTableConfig]:
        """Every sink table of every pipeline (or of ``pipeline``), in file order."""
        for p in self.pipelines if pipeline is None else (self.pipeline(pipeline),):
            yield from p.sinks


# ----------------------------------------------------------------------- loading


def _check_mode(file: Path, mode: int) -> None:
    """Refuse a config file every user may write; warn about one its group may write.

    The file says where every row goes and, with a ``run`` table, which code
    ``reconcile run`` imports and runs (``app``): whoever can write it can run
    code as the pipeline's user and point its sinks elsewhere.
    """
    if mode & stat.S_IWOTH:
        raise ConfigFileError(
            f"{file}: writable by every user (mode {stat.filemode(mode)}); it decides where "
            "rows go and which code `reconcile run` imports, so it is not read. Make it "
            f"writable by its owner only: chmod go-w {file}",
            file=str(file),
        )
    if mode & stat.S_IWGRP:
        log.warning(
            "%s: writable by its group (mode %s): whoever is in the group can change where "
            "rows go and which code `reconcile run` imports (chmod g-w to stop this warning)",
            file,
            stat.filemode(mode),
        )


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
            _check_mode(file, os.fstat(handle.fileno()).st_mode)
            data = tomllib.load(handle)
    except OSError as err:
        raise ConfigFileError(f"{file}: cannot read: {err.strerror}", file=str(file)) from None
    except tomllib.TOMLDecodeError as err:
        # tomllib's message gives the line and column, never the text there.
        raise ConfigFileError(f"{file}: not valid TOML: {err}", file=str(file)) from None
    top = TableReader(file, "", data)
    top.only("store", "metrics", "logs", "pipelines")
    base = file.parent
    store = top.table("store")
    default_store = _store_root(store, base) if store else None
    retention = (None, None) if not store else (
        _retention(store, "retention_hours"), _retention(store, "safety_margin_minutes", "minutes")
    )  # fmt: skip
    if store:
        store.done()
    metrics = _metrics(top.table("metrics"), base)
    logs = _logs(top.table("logs"))
    pipelines_table = top.table("pipelines")
    top.done()
    if pipelines_table is None or not pipelines_table.data:
        raise top.error("at least one pipeline is required ([pipelines.NAME])", "pipelines")
    pipelines = tuple(
        _pipeline(pipelines_table, name, default_store, retention, base, environ)
        for name in list(pipelines_table.data)
    )
    return Config(file, pipelines, metrics, logs)


def _store_root(store: TableReader, base: Path) -> str:
    store.only("root", "retention_hours", "safety_margin_minutes")
    root = store.get("root", str, required=True)
    if not root:
        raise store.error("must not be empty", "root")
    return local_path(root, base)


def _retention(reader: TableReader, key: str, unit: str = "hours") -> float | None:
    """A store's extra retention in hours, or its margin: a finite number >= 0 (None: not given).

    Any fraction: the store's vacuum counts it in seconds. 0 is safe for a running
    pipeline: change files written ahead of their commit are kept by the store's
    safety margin, and the engine's own readers by their holds.
    """
    hours = reader.get(key, (int, float))
    if hours is None:
        return None
    if not (0 <= hours < float("inf")):
        raise reader.error(f"expected a number of {unit} >= 0, got {hours!r}", key)
    return float(hours)


def _pipeline(
    pipelines: TableReader,
    name: str,
    store: str | None,
    retention: tuple[float | None, float | None],
    base: Path,
    env: Mapping[str, str],
) -> PipelineConfig:
    check_name(pipelines, "pipeline", name)
    reader = pipelines.table(name)
    assert reader is not None
    reader.only("store", "progress", "sinks", "run", "store_retention_hours",
                "store_safety_margin_minutes")  # fmt: skip
    own_retention = _retention(reader, "store_retention_hours")
    own_margin = _retention(reader, "store_safety_margin_minutes", "minutes")
    own_store = reader.get("store", str)
    root = local_path(own_store, base) if own_store else store
    if root is None:
        raise reader.error("no expected-state store: set [store] root, or store here", "store")
    progress_text = reader.get("progress", str)
    progress = Path(local_path(progress_text, base)) if progress_text else None
    sinks_table = reader.table("sinks")
    run_table = reader.table("run")
    reader.done()
    if run_table is not None and progress is not None:
        # Main and standby must share one record of the decided epochs: with
        # an expected state that is the store's epochs table, not a folder.
        raise reader.error(
            "a pipeline with a run table keeps its progress in the expected-state store, "
            "which main and standby share: remove progress",
            "progress",
        )
    if sinks_table is None or not sinks_table.data:
        raise reader.error("at least one sink table is required ([...sinks.NAME])", "sinks")
    sinks = []
    for sink_name in list(sinks_table.data):
        check_name(sinks_table, "sink", sink_name)
        sink = sinks_table.table(sink_name)
        assert sink is not None
        sinks.append(_sink(sink, name, sink_name, root, progress, env))
    sinks_table.done()
    run = None
    if run_table is not None:
        connections = [
            (sinks_table.key(f"{s.name}.{s.connection.kind}"), s.connection) for s in sinks
        ]
        run = read_run(run_table, base, connections, env)
        if run.realtime is not None:
            sinks = [replace(s, realtime=True) for s in sinks]
    hours = next((h for h in (own_retention, retention[0]) if h is not None),
                 DEFAULT_RETENTION_HOURS)  # fmt: skip
    minutes = next((m for m in (own_margin, retention[1]) if m is not None),
                   DEFAULT_SAFETY_MARGIN_MINUTES)  # fmt: skip
    return PipelineConfig(name, root, progress, tuple(sinks), run, hours, minutes)


def _sink(
    reader: TableReader,
    pipeline: str,
    name: str,
    store: str,
    progress: Path | None,
    env: Mapping[str, str],
) -> SinkTableConfig:
    reader.only(
        "dsn", "url", "password_env", "table", "keys", "mode", "write_mode", "max_change_fraction"
    )
    connection = read_connection(reader, env)
    table = reader.get("table", str, required=True)
    if not table.strip():
        raise reader.error("must not be empty", "table")
    keys = reader.get("keys", list, required=True)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise reader.error("expected a non-empty array of column names", "keys")
    if len(set(keys)) != len(keys):
        raise reader.error(f"a key column is listed twice: {keys}", "keys")
    mode = choice(reader, "mode", VERIFY_MODES, "auto")
    write_mode = choice(reader, "write_mode", WRITE_MODES, "transactional")
    fraction = reader.get("max_change_fraction", (int, float))
    if fraction is not None and not 0 <= fraction <= 1:
        raise reader.error(f"must be from 0 to 1, got {fraction}", "max_change_fraction")
    reader.done()
    return SinkTableConfig(
        pipeline, name, connection, table, tuple(keys), mode, write_mode, store, progress,
        0.1 if fraction is None else float(fraction),
    )  # fmt: skip


def _metrics(reader: TableReader | None, base: Path) -> MetricsSettings | None:
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
        textfile=Path(local_path(textfile, base)) if textfile is not None else None,
        interval_s=float(interval) if interval is not None else 15.0,
    )


def _logs(reader: TableReader | None) -> LogSettings:
    if reader is None:
        return LogSettings()
    reader.only("json", "level")
    as_json = reader.get("json", bool)
    level = reader.get("level", str)
    reader.done()
    if level is not None and level.upper() not in LEVELS:
        raise reader.error(f"expected one of {list(LEVELS)}, got {level!r}", "level")
    return LogSettings(json=bool(as_json), level=(level or "INFO").upper())
