"""The Delta protocol of the tables the engine writes: one that delta-spark reads too.

A table with a timestamp without a zone needs a table-features protocol
(reader 3, writer 7, ``timestampNtz``). delta-rs writes that protocol without
the ``invariants`` writer feature, which writer 2 implies and which delta-spark
requires of any table with a non-nullable column (the store's ``_epoch`` and
``_op``, a sink's keys): it refuses such a table with
``DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH``. So every way a table gets that
protocol goes through here and lists ``invariants`` in the same commit:

* created: ``create_config`` asks delta-rs for writer 7 up front
  (``delta.minWriterVersion``), which lists every feature writer 2 implied;
* a column added by schema evolution: ``before_new_columns`` raises the
  protocol, with ``invariants``, in a commit of its own before the columns,
  so that no version of the table is one delta-spark refuses;
* a table an older engine created: ``list_invariants``, when a writer claims
  it (under its fence).

Tables without such a column keep reader 1, writer 2 (no table features).
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import CommitProperties, DeltaTable, TableFeatures

__all__ = ["before_new_columns", "create_config", "has_naive_timestamp", "list_invariants"]

_INVARIANTS = "invariants"


def has_naive_timestamp(data_type: pa.DataType) -> bool:
    """Whether ``data_type`` is, or holds, a timestamp without a zone (Delta's timestamp_ntz)."""
    if pa.types.is_timestamp(data_type):
        return data_type.tz is None
    if pa.types.is_struct(data_type):
        return any(
            has_naive_timestamp(data_type.field(i).type) for i in range(data_type.num_fields)
        )
    if pa.types.is_map(data_type):
        return has_naive_timestamp(data_type.key_type) or has_naive_timestamp(data_type.item_type)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return has_naive_timestamp(data_type.value_type)
    if pa.types.is_fixed_size_list(data_type):
        return has_naive_timestamp(data_type.value_type)
    return False


def _naive(schema: pa.Schema) -> bool:
    return any(has_naive_timestamp(field.type) for field in schema)


def create_config(schema: pa.Schema, config: Mapping[str, str] | None = None) -> dict[str, str]:
    """The configuration to create a table of ``schema`` with: ``config``, and writer 7
    when a column needs table features, so the create lists ``invariants`` itself."""
    out = dict(config or {})
    if _naive(schema):
        out["delta.minWriterVersion"] = "7"
    return out


def list_invariants(table: DeltaTable, metadata: Mapping[str, str]) -> bool:
    """Add ``invariants`` to a table-features protocol that lacks it; True if it committed.

    ``metadata`` goes into the commit's commitInfo: the engine's own commit, as
    the store's log audit tells. A concurrent writer doing the same is harmless:
    the feature is listed either way, which is checked again on failure.
    """
    protocol = table.protocol()
    if protocol.min_writer_version < 7 or _INVARIANTS in (protocol.writer_features or ()):
        return False
    try:
        table.alter.add_feature(
            TableFeatures.Invariants,
            commit_properties=CommitProperties(custom_metadata=dict(metadata)),
        )
    except Exception:
        table.update_incremental()
        if _INVARIANTS not in (table.protocol().writer_features or ()):
            raise
        return False
    return True


def before_new_columns(table: DeltaTable, added: pa.Schema, metadata: Mapping[str, str]) -> bool:
    """Before columns ``added`` are committed: raise a writer-2 table to table features,
    ``invariants`` listed, when one of them needs it; True if it committed.

    Left to the schema merge, delta-rs would raise the protocol in the column's
    own commit without ``invariants``: a version delta-spark refuses.
    """
    if not _naive(added):
        return False
    if table.protocol().min_writer_version >= 7:
        return list_invariants(table, metadata)
    table.alter.add_feature(
        [TableFeatures.TimestampWithoutTimezone, TableFeatures.Invariants],
        allow_protocol_versions_increase=True,
        commit_properties=CommitProperties(custom_metadata=dict(metadata)),
    )
    return True
