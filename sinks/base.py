"""The sink contract, re-exported for sinks, and what a backend declares about itself.

The contract lives in the core (``reconcile.core.sink``). A backend (a package
under ``sinks/``) declares itself with a :class:`Backend` in its ``backend``
module; ``sinks.registry`` reads every such declaration and is the only way a
caller picks a sink.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit

from reconcile.core.contract import ConfigurationError
from reconcile.core.extras import install_hint
from reconcile.core.redaction import redact_uri
from reconcile.core.sink import (
    SinkCapabilities,
    TwoPhaseSink,
    bind_writer,
    capabilities_of,
    check_outcome,
    has_durable_prepare,
)

__all__ = [
    "LEASE",
    "PULLABLE",
    "REALTIME",
    "REALTIME_JDBC",
    "SHARED_STAGE",
    "SPARK_PULL",
    "TABLE_SINK",
    "Backend",
    "SinkCapabilities",
    "TwoPhaseSink",
    "bind_writer",
    "capabilities_of",
    "check_outcome",
    "has_durable_prepare",
    "local_path",
    "redact_uri",
    "split_options",
]

# What a backend can build for a connection string, beyond the sinks of its
# schemes. Each names a callable; the registry imports it on first use.
#
# A pullable sink client for pull-and-diff (``recover``):
#   provider(dsn, table, *, name, schema, key) -> a sink with ``recovery_target()`` and ``close()``.
PULLABLE = "pullable"
# The same, whose rows Spark's executors can pull by key range, each task with
# its own connection (``reconcile verify --spark``); same signature.
SPARK_PULL = "spark_pull"
# The writing sink of a keyed table that ``reconcile run`` drives:
#   provider(dsn, table, *, mode, name, schema, key) -> TwoPhaseSink.
TABLE_SINK = "table_sink"
# The leadership lease of a highly available pipeline (``reconcile.ha``):
#   provider(dsn, pipeline, **options) -> reconcile.core.lease.Lease.
LEASE = "lease"
# A staging table Spark's executors fill and the sink's commit reads: the
# class of its ``reconcile.core.staged.SharedStage``, which executors unpickle
# (a sink offers it through ``stage_target()`` when its capabilities say
# ``shared_stage``; a warmed executor imports it beforehand).
SHARED_STAGE = "shared_stage"
# Small transactions of Kafka records with per-partition offset markers, for
# Spark's Real-Time Mode (``reconcile.spark.realtime``):
#   provider(target: sinks.realtime.RealtimeTarget) -> sinks.realtime.RealtimeWriter.
REALTIME = "realtime"
# The same transactions run by Real-Time Mode's JVM writer (jvm/realtime-writer), which
# connects through JDBC: provider(dsn: str, what: str) -> (url, properties), the URL
# without a secret, the properties with the password.
REALTIME_JDBC = "realtime_jdbc"


@dataclass(frozen=True)
class Backend:
    """One sink backend, as it declares itself in ``sinks/<package>/backend.py`` (``BACKEND``).

    Every reference is a ``module:attribute`` string, imported only when a
    caller asks for it, so that reading the declaration needs none of the
    backend's own dependencies.

    Attributes:
        name: the backend's name (``postgres``).
        schemes: the URI schemes whose sinks it builds (``postgresql``).
        open: ``module:attribute`` of ``factory(name, uri) -> TwoPhaseSink``,
            what ``open_sink`` calls for those schemes.
        extra: the optional dependency group of ``reconcile-engine`` that
            installs what it needs (``pip install 'reconcile-engine[EXTRA]'``);
            None when the base install has it all.
        requires: the modules that extra installs; imported before anything
            of the backend, so that a missing one is named with its extra.
        capabilities: capability (``PULLABLE``, ``SPARK_PULL``,
            ``TABLE_SINK``, ``LEASE``, ``SHARED_STAGE``) -> ``module:attribute``
            that provides it.
        accepts: connection strings it takes beside its schemes' URIs (a
            libpq ``key=value`` DSN), or None.
        generic: it reaches its systems through a generic driver
            (SQLAlchemy): what a caller gets when it turns a backend's fast
            path off.
    """

    name: str
    schemes: tuple[str, ...]
    open: str
    extra: str | None = None
    requires: tuple[str, ...] = ()
    capabilities: Mapping[str, str] = field(default_factory=dict)
    accepts: Callable[[str], bool] | None = None
    generic: bool = False

    @property
    def install_hint(self) -> str:
        """The command that installs what this backend needs."""
        return "pip install reconcile-engine" if self.extra is None else install_hint(self.extra)


def local_path(name: str, uri: str) -> str:
    """The path of a ``scheme:///path`` URI; a remote host is refused.

    Raises:
        ConfigurationError: the URI names a host other than localhost.
    """
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise ConfigurationError(
            f"sink {name!r}: {parts.scheme} URI {redact_uri(uri)!r} must be local "
            f"({parts.scheme}:///path)"
        )
    return parts.path


def split_options(uri: str, options: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """``uri`` without the query parameters named in ``options``, and their values.

    A sink URI carries the sink's own options (``?table=T&schema=S``) beside
    the driver's parameters (``?connect_timeout=3``): the driver gets the URI
    without the sink's. The rest of the URI is kept as written (rebuilding it
    from its parts would turn ``sqlite:////abs/path`` into a relative path).
    """
    base, _, query = uri.partition("?")
    query = query.partition("#")[0]
    params = parse_qsl(query, keep_blank_values=True)
    ours = {key: value for key, value in params if key in options}
    rest = urlencode([(key, value) for key, value in params if key not in ours])
    return (f"{base}?{rest}" if rest else base), ours


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], object]:
    """A package's ``__getattr__`` that imports each public name from its module on first use.

    A backend package's ``__init__`` must stay importable without the backend's
    optional extra (the registry reads ``<package>.backend`` to learn what it
    needs), yet ``from sinks.postgres import postgres_sink`` is the documented
    way in: the name's module is imported only when the name is asked for, so a
    missing extra fails there, naming itself, and never while the registry looks.
    """

    def __getattr__(name: str) -> object:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
