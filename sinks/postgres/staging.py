"""Staged epoch batches: normalizing rows, Changes and Arrow tables, and validating them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import Change, InvalidInputError
from reconcile.core.staged import StagedEpoch

from .arrow_batch import hashable_key, shown_key, validate_arrow
from .schema import EPOCH_COLUMN, TableSchema
from .values import NO_VALUE, NOT_NULL, BadValue, BatchErrors, approx_bytes, coerce_value, oversize

__all__ = ["EpochBatch", "ValidatedBatch", "validate_batch"]


@dataclass
class EpochBatch:
    """What has been staged for one epoch, in arrival order, not yet validated."""

    upserts: list[dict[str, Any]] = field(default_factory=list)
    deletes: list[dict[str, Any]] = field(default_factory=list)
    tables: list[pa.Table] = field(default_factory=list)
    staged: StagedEpoch | None = None  # rows Spark executors staged in Postgres

    def add(self, rows: Iterable[Any], *, id_column: str | None) -> None:
        """Append rows: dicts (upserts), Changes, or Arrow tables / record batches.

        Args:
            rows: the rows, or a single Arrow table.
            id_column: for an append-only target, the change-id column that a
                Change's ``change_id`` fills in; None for a keyed target.

        Raises:
            InvalidInputError: for a value that is not a row; nothing is staged then.
        """
        if isinstance(rows, StagedEpoch) or self.staged is not None:
            # Rows already in the staging table are upserted from there by
            # SQL: they cannot be mixed with rows sent from this process.
            if self.staged is not None or len(self) or not isinstance(rows, StagedEpoch):
                raise InvalidInputError(
                    "rows staged by Spark executors make the whole epoch; they cannot be "
                    "mixed with other rows; nothing was staged"
                )
            self.staged = rows
            return
        if isinstance(rows, pa.Table | pa.RecordBatch):
            rows = [rows]
        upserts: list[dict[str, Any]] = []
        deletes: list[dict[str, Any]] = []
        tables: list[pa.Table] = []
        for index, item in enumerate(rows):
            if isinstance(item, pa.Table):
                tables.append(item)
            elif isinstance(item, pa.RecordBatch):
                tables.append(pa.Table.from_batches([item]))
            elif isinstance(item, Change):
                row = dict(item.row)
                if id_column is not None:
                    if item.op == "delete":
                        raise InvalidInputError(
                            f"staged item {index} is a delete, but the target is append-only "
                            f"(keyed by change id column {id_column!r}); nothing was staged"
                        )
                    if item.change_id is not None:
                        given = row.get(id_column)
                        if given is not None and str(given) != str(item.change_id):
                            raise InvalidInputError(
                                f"staged item {index}: row column {id_column!r} = {given!r} "
                                f"differs from change_id {item.change_id!r}; nothing was staged"
                            )
                        row[id_column] = item.change_id
                (deletes if item.op == "delete" else upserts).append(row)
            elif isinstance(item, dict):
                upserts.append(item)
            else:
                raise InvalidInputError(
                    f"staged item {index} is a {type(item).__name__} ({item!r:.80}); expected a "
                    "dict row, a Change or an Arrow table; nothing was staged"
                )
        self.upserts.extend(upserts)
        self.deletes.extend(deletes)
        self.tables.extend(tables)

    def __len__(self) -> int:
        arrow_rows: int = sum(t.num_rows for t in self.tables)
        staged = self.staged.rows if self.staged is not None else 0
        return len(self.upserts) + len(self.deletes) + arrow_rows + staged


@dataclass
class ValidatedBatch:
    """A batch checked against the target table, with values coerced for COPY."""

    columns: tuple[str, ...]  # upserted columns, in table order; excludes _epoch
    rows: list[tuple[Any, ...]]  # dict upserts, coerced, in ``columns`` order
    arrow: pa.Table | None  # Arrow upserts, columns in ``columns`` order
    delete_keys: list[tuple[Any, ...]]  # key values, in schema.key order
    row_bytes: list[int] = field(default_factory=list)  # about how big each of ``rows`` is
    staged: StagedEpoch | None = None  # upserts already in a staging table (then no other rows)

    @property
    def row_count(self) -> int:
        """Rows upserted plus keys deleted."""
        arrow_rows = self.arrow.num_rows if self.arrow is not None else 0
        staged = self.staged.rows if self.staged is not None else 0
        return len(self.rows) + arrow_rows + len(self.delete_keys) + staged


def _column_mismatch(
    check: BatchErrors,
    cols: Mapping[str, Any],
    first: set[str],
    other: set[str],
    index: int,
) -> InvalidInputError:
    """The error for an upsert whose columns differ from the first one's.

    It names the column that is most likely wrong: one the table does not
    have (a typo) before one that is merely left out, and says which row.
    """
    unknown = sorted(c for c in other ^ first if c not in cols and c != EPOCH_COLUMN)
    missing, extra = sorted(first - other), sorted(other - first)
    detail = f"upsert {index} gives {extra or 'no other column'} and lacks {missing or 'none'}"
    if unknown:
        return check.error(
            f"the table has no such column ({detail}; every upsert of an epoch must give "
            "the same columns)",
            unknown[0],
        )
    return check.error(
        f"the upserts of one epoch must all give the same columns ({detail})",
        (extra or missing)[0],
    )


def validate_batch(
    schema: TableSchema, batch: EpochBatch, *, sink: str, epoch: int
) -> ValidatedBatch:
    """Check a staged batch against the target table before anything is written.

    Raises:
        InvalidInputError: for an unknown column, a column that the database
            writes itself (identity ALWAYS, generated), a value of an
            incompatible type or that does not fit a numeric(p, s) exactly, a
            NULL in a key or NOT NULL column, a missing key column, a key that
            occurs twice among the epoch's changes, or a row too large to send.
    """
    check = BatchErrors(sink, schema, epoch)
    cols = schema.columns
    given: set[str] | None = None
    sources = [set(r) for r in batch.upserts] + [set(t.column_names) for t in batch.tables]
    if batch.staged is not None:
        # Only the columns can be checked here: the values are in the staging
        # table, typed by it, and the executors netted them to one per key.
        sources.append(set(batch.staged.columns))
    for index, source in enumerate(sources):
        if given is None:
            given = source
        elif source != given:
            raise _column_mismatch(check, cols, given, source, index)
    given = given or set()
    for name in sorted(given):
        if name == EPOCH_COLUMN:
            value = next((r[name] for r in batch.upserts if name in r), NO_VALUE)
            raise check.error("the sink writes this column itself; do not give it", name, value)
        if name not in cols:
            value = next((r[name] for r in batch.upserts if name in r), NO_VALUE)
            raise check.error("the table has no such column (missing column)", name, value)
        refused = cols[name].written_by_database
        if refused is not None:
            value = next((r[name] for r in batch.upserts if name in r), NO_VALUE)
            raise check.error(refused, name, value)
    if given:
        for name in schema.key:
            if name not in given:
                raise check.error("key column missing from the upserted rows", name)
        for col in cols.values():
            missing = col.name not in given and col.name != EPOCH_COLUMN
            if col.not_null and not col.has_default and missing:
                raise check.error("NOT NULL column missing from the upserted rows", col.name,
                                  sqlstate=NOT_NULL)  # fmt: skip
    columns = tuple(c for c in cols if c in given)
    if batch.staged is not None:
        return ValidatedBatch(columns=columns, rows=[], arrow=None, delete_keys=[],
                              staged=batch.staged)  # fmt: skip
    key_pos = [columns.index(k) for k in schema.key] if given else []

    rows: list[tuple[Any, ...]] = []
    row_bytes: list[int] = []
    seen: dict[Any, int] = {}
    for index, raw in enumerate(batch.upserts):
        out: list[Any] = []
        for name in columns:
            col, value = cols[name], raw[name]
            if value is None:
                if name in schema.key:
                    raise check.error(f"NULL in key column (row {index})", name, None,
                                      sqlstate=NOT_NULL)  # fmt: skip
                if col.not_null:
                    raise check.error(f"NULL in NOT NULL column (row {index})", name, None,
                                      sqlstate=NOT_NULL)  # fmt: skip
                out.append(None)
                continue
            try:
                out.append(coerce_value(col, value))
            except BadValue as bad:
                raise check.error(f"{bad.phrase} (row {index})", name, value) from None
        size = sum(approx_bytes(v) for v in out)
        if (too_large := oversize(f"row {index}", size)) is not None:
            raise check.error(too_large)
        row_bytes.append(size)
        key = hashable_key(tuple(out[p] for p in key_pos))
        if key in seen:
            raise check.error(
                f"duplicate key among the epoch's upserts (rows {seen[key]} and {index})",
                ",".join(schema.key),
                shown_key(key),
            )
        seen[key] = index
        rows.append(tuple(out))

    arrow = validate_arrow(check, schema, batch.tables, columns, seen) if batch.tables else None

    delete_keys: list[tuple[Any, ...]] = []
    deleted: set[Any] = set()
    for index, raw in enumerate(batch.deletes):
        values = []
        for name in schema.key:
            value = raw.get(name)
            if value is None:
                raise check.error(f"NULL or missing key column in delete {index}", name, value)
            try:
                values.append(coerce_value(cols[name], value))
            except BadValue as bad:
                raise check.error(f"{bad.phrase} (delete {index})", name, value) from None
        key = hashable_key(tuple(values))
        if key in seen:
            raise check.error(
                "key is both upserted and deleted in one epoch; the order is ambiguous",
                ",".join(schema.key),
                shown_key(key),
            )
        if key not in deleted:
            deleted.add(key)
            delete_keys.append(tuple(values))
    return ValidatedBatch(
        columns=columns, rows=rows, arrow=arrow, delete_keys=delete_keys, row_bytes=row_bytes
    )
