"""The Iceberg sink's table in its catalog: loaded fresh for every operation, created once.

Every operation of the sink loads the table's newest metadata from the
catalog: what it decides (the epoch is in, the writer is fenced, the epoch is
prepared) is read from that metadata, and its commit requires main to be
where that metadata said (``sinks.iceberg.tokens.commit_once``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.table import Table

from reconcile.core.contract import ConfigurationError
from sinks.iceberg.location import IcebergLocation

__all__ = ["create_table", "key_columns", "load_table"]


def load_table(catalog: Catalog, location: IcebergLocation) -> Table | None:
    """The table at its newest metadata; None before it exists."""
    try:
        return catalog.load_table(location.identifier)
    except NoSuchTableError:
        return None


def create_table(
    catalog: Catalog, location: IcebergLocation, schema: pa.Schema, keys: Sequence[str]
) -> Table:
    """Create the table (and its namespace) with ``keys`` as its identifier fields.

    Created in one catalog commit, so no process ever loads it without its
    key. A table another process created meanwhile is loaded instead.
    """
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(location.namespace)
    try:
        creating = catalog.create_table_transaction(location.identifier, schema=schema)
        with creating.update_schema() as update:
            update.set_identifier_fields(*keys)
        return creating.commit_transaction()
    except TableAlreadyExistsError:
        return catalog.load_table(location.identifier)


def key_columns(table: Table | None, given: Sequence[str], where: str) -> list[str]:
    """The key: the columns given, else the table's identifier fields.

    Raises:
        ConfigurationError: no key given and the table has none (or does not
            exist yet), or a given key column the table lacks.
    """
    if table is not None:
        schema = table.schema()
        names = [f.name for f in schema.fields]
        for key in given:
            if key not in names:
                raise ConfigurationError(
                    f"{where}: key column {key!r} is not in the table (columns: {names})"
                )
        if not given:
            identifier = [schema.find_column_name(i) for i in schema.identifier_field_ids]
            if identifier:
                return [name for name in identifier if name is not None]
    if given:
        return list(given)
    raise ConfigurationError(
        f"{where}: no key: the table has no identifier fields"
        + (" (it does not exist yet)" if table is None else "")
        + "; give key=... (the URI's key=k1,k2, or the sink's key argument)"
    )
