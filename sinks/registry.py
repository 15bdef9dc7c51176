"""Find a sink by URI scheme or connection string: every backend declares itself.

A backend is a package under ``sinks/`` with a ``backend`` module whose
``BACKEND`` (a :class:`sinks.base.Backend`) names its schemes, the factory of
its sinks, its capabilities and the optional extra it needs, each as a
``module:attribute`` string. The registry finds those modules by listing the
``sinks`` package (no table of backends here), reads the declarations, which
import nothing of the backends' dependencies, and imports a factory or a
capability only when a caller asks for it. It is the only way any caller
picks a sink:

- :func:`open_sink` builds the sink a URI describes (``memory://``,
  ``file:///path``, ``http(s)://``, ``delta:///path``, ``postgresql://``,
  ``sqlite:///path?table=T`` and the other SQLAlchemy dialects);
- :func:`capability` gives what the backend of a connection string provides
  beyond its sinks (``sinks.base.PULLABLE``, ``SPARK_PULL``, ``TABLE_SINK``,
  ``LEASE``), and :func:`provides` says whether it does.

A dependency that is not installed is a ConfigurationError that names the
extra to install (``pip install 'reconcile-engine[postgres]'``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
import re
from collections.abc import Callable
from typing import Any

import sinks
from reconcile.core.contract import ConfigurationError
from sinks.base import Backend, TwoPhaseSink, redact_uri

__all__ = [
    "backend_for",
    "backends",
    "capability",
    "open_sink",
    "preload",
    "provides",
    "redact_uri",
    "register",
]

_CUSTOM: dict[str, Callable[[str, str], TwoPhaseSink]] = {}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@functools.cache
def backends() -> tuple[Backend, ...]:
    """Every backend under ``sinks/``, by name (read once per process).

    Raises:
        ConfigurationError: two backends claim one name or one scheme.
    """
    found: dict[str, Backend] = {}
    claimed: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(sinks.__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        declaration = f"sinks.{info.name}.backend"
        if importlib.util.find_spec(declaration) is None:
            continue  # a shared package (sinks.objects), not a backend
        backend = importlib.import_module(declaration).BACKEND
        if not isinstance(backend, Backend):
            raise ConfigurationError(f"{declaration}.BACKEND is not a sinks.base.Backend")
        if backend.name in found:
            raise ConfigurationError(f"two sink backends are named {backend.name!r}")
        for scheme in backend.schemes:
            if scheme in claimed:
                raise ConfigurationError(
                    f"scheme {scheme}:// is claimed by the {claimed[scheme]} and the "
                    f"{backend.name} backends"
                )
            claimed[scheme] = backend.name
        found[backend.name] = backend
    return tuple(found[name] for name in sorted(found))


def _scheme(connection: str) -> str:
    match = _URL.match(connection.strip())
    return match.group(1).lower() if match else ""


def _known() -> list[str]:
    return sorted({*(s for b in backends() for s in b.schemes), *_CUSTOM})


def backend_for(connection: str) -> Backend:
    """The backend that takes ``connection``: a URI of one of its schemes, or a string it accepts.

    Raises:
        ConfigurationError: no backend takes it (the password is not shown).
    """
    scheme = _scheme(connection)
    for backend in backends():
        if scheme in backend.schemes:
            return backend
    for backend in backends():
        if backend.accepts is not None and backend.accepts(connection):
            return backend
    shown = redact_uri(connection) if scheme else "a connection string (not shown)"
    raise ConfigurationError(f"unknown scheme in {shown!r}; known: {_known()}")


def provides(connection: str, name: str) -> bool:
    """Whether the backend of ``connection`` provides capability ``name`` (False: none takes it)."""
    try:
        backend = backend_for(connection)
    except ConfigurationError:
        return False
    return name in backend.capabilities


def capability(connection: str, name: str, *, generic: bool = False) -> Any:
    """What the backend of ``connection`` provides as capability ``name``, imported.

    Args:
        connection: a URI or connection string (a libpq DSN, an SQLAlchemy URL).
        name: ``sinks.base.PULLABLE``, ``SPARK_PULL``, ``TABLE_SINK`` or ``LEASE``.
        generic: take the backend that reaches any database through a generic
            driver (SQLAlchemy), not the one of ``connection``'s own system:
            a caller that turns the fast path off.

    Raises:
        ConfigurationError: no backend takes ``connection``; its backend does
            not provide ``name`` (the backends that do are named); or the
            extra it needs is not installed (naming it).
    """
    if generic:
        chosen = [b for b in backends() if b.generic and name in b.capabilities]
        if not chosen:
            raise ConfigurationError(f"no generic sink backend provides {name}")
        backend = chosen[0]
    else:
        backend = backend_for(connection)
    if name not in backend.capabilities:
        able = [b.name for b in backends() if name in b.capabilities]
        raise ConfigurationError(
            f"the {backend.name} sinks do not provide {name}; the backends that do: {able}"
        )
    return _load(backend, backend.capabilities[name])


def preload(name: str) -> list[str]:
    """Import what every backend provides as ``name``, where its extra is installed.

    A Spark executor that will run a backend's code (a staging task) imports
    it before the first micro-batch needs it. A backend whose extra is
    missing is skipped: nothing of it can be in use.

    Returns:
        The names of the backends whose provider was imported.
    """
    loaded = []
    for backend in backends():
        if name in backend.capabilities:
            try:
                _load(backend, backend.capabilities[name])
            except ConfigurationError:
                continue  # its extra is not installed
            loaded.append(backend.name)
    return loaded


def _load(backend: Backend, reference: str) -> Any:
    """Import ``module:attribute`` of ``backend``, its extra's modules first."""
    for module in backend.requires:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigurationError(
                f"the {backend.name} sinks need {module}, which is not installed: "
                f"{backend.install_hint}"
            ) from exc
    module_name, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def register(scheme: str, factory: Callable[[str, str], TwoPhaseSink]) -> None:
    """Make ``open_sink`` build ``scheme://...`` sinks with ``factory(name, uri)``."""
    _CUSTOM[scheme] = factory


def open_sink(name: str, uri: str) -> TwoPhaseSink:
    """Build the sink named ``name`` that ``uri`` describes.

    ``memory://`` (a process-local store), ``file:///path``, ``http(s)://host/base``,
    ``delta:///path`` (the Delta sink's tables under that folder),
    ``postgresql://user:pw@host/db?table=T&mode=prepared`` (``table`` defaults to
    the sink name, ``mode`` to transactional; ``schema`` and ``state_schema`` are
    the sink's options of those names; other parameters go to libpq), and any
    SQLAlchemy URL (``sqlite:///path?table=T``, ``mysql+pymysql://...``) for
    the SQL sink (``table`` and ``schema`` as for Postgres).

    Raises:
        ConfigurationError: unknown scheme, or the backend's extra is not
            installed (the error says which to install). A URI in a message
            has its password and secret query values replaced by ***.
    """
    scheme = _scheme(uri)
    if scheme in _CUSTOM:
        return _CUSTOM[scheme](name, uri)
    try:
        backend = backend_for(uri) if scheme else None
    except ConfigurationError:
        backend = None
    if backend is None:
        raise ConfigurationError(
            f"sink {name!r}: unknown scheme in {redact_uri(uri)!r}; known: {_known()}"
        )
    factory: Callable[[str, str], TwoPhaseSink] = _load(backend, backend.open)
    return factory(name, uri)
