"""Find a sink by URI scheme, importing its module only when it is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from reconcile.core.contract import ConfigurationError
from sinks.base import TwoPhaseSink

__all__ = ["open_sink", "redact_uri", "register"]

# scheme -> (module, factory name, extra that provides its dependencies)
_BUILTIN: dict[str, tuple[str, str, str | None]] = {
    "memory": ("sinks.registry", "_memory", None),
    "file": ("sinks.registry", "_file", None),
    "http": ("sinks.registry", "_http", None),
    "https": ("sinks.registry", "_http", None),
    "postgresql": ("sinks.registry", "_postgres", None),
    "postgres": ("sinks.registry", "_postgres", None),
    "postgresql+psycopg": ("sinks.registry", "_postgres", None),
    "delta": ("sinks.registry", "_delta", None),
}
_CUSTOM: dict[str, Callable[[str, str], TwoPhaseSink]] = {}

# Query parameters whose values are secrets (libpq's password and sslpassword,
# and the usual names of tokens): never shown in an error.
_SECRET_QUERY_KEYS = frozenset(
    {"password", "sslpassword", "passwd", "pwd", "secret", "token", "access_token", "api_key"}
)


def redact_uri(uri: str) -> str:
    """``uri`` with the password of its user info and secret query values replaced by ***."""
    try:
        parts = urlsplit(uri)
        netloc = parts.netloc
        userinfo, at, host = netloc.rpartition("@")
        if at and ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
        query = "&".join(
            f"{key}=***" if key.lower() in _SECRET_QUERY_KEYS else f"{key}={value}"
            for key, value in parse_qsl(parts.query, keep_blank_values=True)
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        # urlsplit refuses some strings (a bad IPv6 host): show nothing of them.
        return "<a URI that cannot be parsed>"


def register(scheme: str, factory: Callable[[str, str], TwoPhaseSink]) -> None:
    """Make ``open_sink`` build ``scheme://...`` sinks with ``factory(name, uri)``."""
    _CUSTOM[scheme] = factory


def open_sink(name: str, uri: str) -> TwoPhaseSink:
    """Build the sink named ``name`` that ``uri`` describes.

    ``memory://`` (a process-local store), ``file:///path``, ``http(s)://host/base``,
    ``delta:///path`` (the Delta sink's tables under that folder), and
    ``postgresql://user:pw@host/db?table=T&mode=prepared`` (``table`` defaults to
    the sink name, ``mode`` to transactional; ``schema`` and ``state_schema`` are
    the sink's options of those names; other parameters go to libpq).

    Raises:
        ConfigurationError: unknown scheme, or its module cannot be imported
            (the error says which extra to install). A URI in a message has its
            password and secret query values replaced by ***.
    """
    scheme = urlsplit(uri).scheme
    if scheme in _CUSTOM:
        return _CUSTOM[scheme](name, uri)
    if scheme not in _BUILTIN:
        known = sorted({*_BUILTIN, *_CUSTOM})
        raise ConfigurationError(
            f"sink {name!r}: unknown scheme in {redact_uri(uri)!r}; known: {known}"
        )
    module_name, factory_name, extra = _BUILTIN[scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"pip install 'reconcile-engine[{extra}]'" if extra else "reinstall reconcile-engine"
        raise ConfigurationError(f"sink {name!r} ({scheme}://) needs {exc.name}: {hint}") from exc
    factory: Callable[[str, str], TwoPhaseSink] = getattr(module, factory_name)
    return factory(name, uri)


_MEMORY_STORES: dict[str, Any] = {}


def _memory(name: str, uri: str) -> TwoPhaseSink:
    from sinks.memory import MemorySink, MemoryStore

    store = _MEMORY_STORES.setdefault(urlsplit(uri).netloc, MemoryStore())
    return MemorySink(name, store)


def _file(name: str, uri: str) -> TwoPhaseSink:
    from sinks.files import FileSink

    return FileSink(name, _local_path(name, uri))


def _postgres(name: str, uri: str) -> TwoPhaseSink:
    from sinks.postgres import postgres_sink

    parts = urlsplit(uri)
    params = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in params if k in ("table", "mode", "schema", "state_schema")}
    libpq = urlencode([(k, v) for k, v in params if k not in ours])
    dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, libpq, ""))
    options = {k: ours[k] for k in ("schema", "state_schema") if k in ours}
    return postgres_sink(
        dsn, ours.get("table", name), mode=ours.get("mode", "transactional"), name=name, **options
    )


def _delta(name: str, uri: str) -> TwoPhaseSink:
    from sinks.delta import DeltaSink

    return DeltaSink(name, _local_path(name, uri))


def _local_path(name: str, uri: str) -> str:
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise ConfigurationError(
            f"sink {name!r}: {parts.scheme} URI {redact_uri(uri)!r} must be local "
            f"({parts.scheme}:///path)"
        )
    return parts.path


def _http(name: str, uri: str) -> TwoPhaseSink:
    from sinks.http import HttpSink

    return HttpSink(name, uri)
