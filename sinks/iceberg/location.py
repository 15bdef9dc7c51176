"""Where an Iceberg sink's table is: its catalog (any pyiceberg supports), namespace and name.

A sink URI is ``iceberg://CATALOG?PROPERTIES``. ``CATALOG`` is the catalog's
name (``default`` when left out); the query's parameters are pyiceberg's
catalog properties (``type=sql&uri=sqlite:////path/catalog.db&warehouse=file:///path``,
``type=rest&uri=https://...``, ``type=glue``, ...), except the sink's own:

- ``namespace``: the table's namespace (default ``reconcile``);
- ``table``: the table's name (default: the sink's name);
- ``key``: the key columns, comma-separated (default: the table's identifier fields).

With no catalog property at all, pyiceberg reads the catalog's settings from
``~/.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__<NAME>__*`` variables, as its own
``load_catalog(name)`` does. A value may be percent-encoded (``uri=sqlite%3A...``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.io import PY_IO_IMPL

from reconcile.core.contract import ConfigurationError
from reconcile.core.redaction import is_secret_name, redact, redact_uri
from sinks.iceberg.bounded_io import IO_IMPL

__all__ = ["DEFAULT_NAMESPACE", "IcebergLocation", "parse_uri"]

DEFAULT_NAMESPACE = "reconcile"
_OURS = ("namespace", "table", "key")


@dataclass(frozen=True)
class IcebergLocation:
    """One Iceberg table: the catalog that holds it and its identifier.

    Attributes:
        catalog: the catalog's name (pyiceberg's ``load_catalog(name)``).
        properties: the catalog's properties (``type``, ``uri``, ``warehouse``, ...).
        namespace: the table's namespace.
        table: the table's name.
        key: the key columns given; empty: the table's identifier fields.
    """

    catalog: str
    # Not in the repr: a property may hold a secret (credential=, s3.secret-access-key=).
    properties: dict[str, str] = field(default_factory=dict, repr=False)
    namespace: str = DEFAULT_NAMESPACE
    table: str = ""
    key: tuple[str, ...] = ()

    @property
    def identifier(self) -> str:
        """``namespace.table``, as pyiceberg names it."""
        return f"{self.namespace}.{self.table}"

    def display(self) -> str:
        """The table in messages: catalog, namespace, name (no property: it may hold secrets)."""
        return f"{self.catalog}.{self.identifier}"

    def load_catalog(self) -> Catalog:
        """A new client of the catalog (each sink client and each pull has its own).

        Raises:
            ConfigurationError: pyiceberg cannot build the catalog from these
                properties (the properties are not shown: they may hold secrets).
        """
        properties = dict(self.properties)
        if properties and PY_IO_IMPL not in properties:
            # The catalog reads table metadata through a FileIO that bounds it
            # (sinks.iceberg.bounded_io); a FileIO the user chose is kept.
            properties[PY_IO_IMPL] = IO_IMPL
        try:
            return load_catalog(self.catalog, **properties)
        except Exception as exc:  # pyiceberg raises ValueError, NotInstalledError, ...
            # pyiceberg's message may echo a property: the secret ones are taken out.
            secrets = [v for k, v in self.properties.items() if is_secret_name(k)]
            raise ConfigurationError(
                f"Iceberg catalog {self.catalog!r} cannot be loaded with the properties given "
                f"({sorted(self.properties)}): {type(exc).__name__}: {redact(str(exc), *secrets)}"
            ) from None

    def with_table(
        self, table: str, *, namespace: str | None = None, key: Sequence[str] | None = None
    ) -> IcebergLocation:
        """The same catalog, another table (a config file's ``namespace.table`` and keys)."""
        return IcebergLocation(
            self.catalog,
            dict(self.properties),
            namespace or self.namespace,
            table,
            tuple(key) if key else self.key,
        )


def parse_uri(uri: str, *, default_table: str) -> IcebergLocation:
    """The location ``iceberg://CATALOG?PROPERTIES`` names (see the module's docstring).

    Raises:
        ConfigurationError: not an ``iceberg://`` URI, or a sink option that is
            empty (the URI is shown with its secrets replaced by ***).
    """
    parts = urlsplit(uri)
    if parts.scheme.lower() != "iceberg":
        raise ConfigurationError(f"not an iceberg:// URI: {redact_uri(uri)!r}")
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    ours = {k: params.pop(k) for k in _OURS if k in params}
    for name, value in ours.items():
        if not value.strip():
            raise ConfigurationError(f"iceberg URI {redact_uri(uri)!r}: {name}= is empty")
    key = tuple(k.strip() for k in ours.get("key", "").split(",") if k.strip())
    return IcebergLocation(
        catalog=parts.hostname or "default",
        properties=params,
        namespace=ours.get("namespace", DEFAULT_NAMESPACE),
        table=ours.get("table", default_table),
        key=key,
    )
