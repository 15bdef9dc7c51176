"""Reflection of a sink's target table: columns, types, nullability, the key, and the catalog
facts (rules, triggers, row security, identity and generated columns) that decide whether a
batch may be COPied straight into it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from reconcile.core.contract import ConfigurationError
from reconcile.core.keys import check_sql_keys

__all__ = ["EPOCH_COLUMN", "Column", "TableSchema", "direct_copy_blockers", "reflect_table"]

# The column in which the sink records the last epoch that wrote each row; the
# scoped pull-and-diff recovery reads it.
EPOCH_COLUMN = "_epoch"

# pg type name -> the kind of Python value accepted for it (see staging.py).
_KINDS = {
    "int2": "int",
    "int4": "int",
    "int8": "int",
    "numeric": "numeric",
    "float4": "float",
    "float8": "float",
    "bool": "bool",
    "text": "text",
    "varchar": "text",
    "bpchar": "text",
    "name": "text",
    "citext": "text",
    "uuid": "uuid",
    "date": "date",
    "timestamp": "timestamp",
    "timestamptz": "timestamptz",
    "time": "time",
    "json": "json",
    "jsonb": "json",
    "bytea": "bytes",
    "interval": "interval",
}

_COLUMNS_SQL = """
SELECT a.attname, t.typname, format_type(a.atttypid, a.atttypmod), a.atttypmod,
       a.attnotnull, a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '', a.atttypid,
       a.attidentity::text, a.attgenerated::text
  FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum
"""

_KEYS_SQL = """
SELECT i.indisprimary, array_agg(a.attname ORDER BY k.ord), i.indimmediate
  FROM pg_index i
  CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
 WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
 GROUP BY i.indexrelid, i.indisprimary, i.indimmediate
 ORDER BY i.indisprimary DESC, i.indexrelid
"""


@dataclass(frozen=True)
class Column:
    """One column of the target table as the server describes it."""

    name: str
    typname: str
    sql_type: str  # format_type(): server-quoted, e.g. 'character varying(10)'
    typmod: int
    not_null: bool
    has_default: bool
    type_oid: int
    identity: str = ""  # pg_attribute.attidentity: 'a' ALWAYS, 'd' BY DEFAULT, '' none
    generated: str = ""  # pg_attribute.attgenerated: 's' STORED, '' none

    @property
    def kind(self) -> str:
        """The value kind accepted for this column ('int', 'text', ... or 'other')."""
        return _KINDS.get(self.typname, "other")

    @property
    def max_length(self) -> int | None:
        """The declared length of varchar(n) / char(n), else None."""
        if self.typname in ("varchar", "bpchar") and self.typmod > 4:
            return self.typmod - 4
        return None

    @property
    def numeric_bounds(self) -> tuple[int | None, int | None]:
        """(precision, scale) of numeric(p, s); (None, None) for an unconstrained numeric."""
        if self.typname != "numeric" or self.typmod < 4:
            return None, None
        # The typmod packs ((precision << 16) | (scale & 0x7ff)) + VARHDRSZ; the
        # scale is an 11-bit signed number (PostgreSQL 15 allows negative scales).
        packed = self.typmod - 4
        precision = (packed >> 16) & 0xFFFF
        scale = ((packed & 0x7FF) ^ 1024) - 1024
        return precision, scale

    @property
    def written_by_database(self) -> str | None:
        """Why the sink must not write this column (identity ALWAYS, generated), else None."""
        if self.identity == "a":
            return (
                "the column is GENERATED ALWAYS AS IDENTITY: the database assigns its values; "
                "do not give it (an explicit value would need OVERRIDING SYSTEM VALUE and "
                "would leave the identity sequence behind)"
            )
        if self.generated:
            return (
                "the column is GENERATED ALWAYS AS (...) STORED: the database computes it; "
                "do not give it"
            )
        return None


@dataclass(frozen=True)
class TableSchema:
    """The target table: qualified name, columns by name, and the key used for upserts."""

    schema: str
    table: str
    columns: dict[str, Column]
    key: tuple[str, ...]

    @property
    def ident(self) -> sql.Composable:
        """The quoted, schema-qualified table name."""
        return sql.Identifier(self.schema, self.table)

    @property
    def display(self) -> str:
        """The table name as it appears in messages."""
        return f"{self.schema}.{self.table}"

    @property
    def has_epoch_column(self) -> bool:
        """True if the table has the ``_epoch`` column that the sink fills in."""
        return EPOCH_COLUMN in self.columns


def reflect_table(
    conn: psycopg.Connection[Any],
    schema: str | None,
    table: str,
    key: tuple[str, ...] | None = None,
) -> TableSchema:
    """Read the target table's definition from the catalog.

    Args:
        conn: an open connection.
        schema: the table's schema; None means the session's current schema.
        table: the table name, unquoted (any characters).
        key: the columns that identify a row; default the primary key. They
            must be covered by a unique index, since upserts use ON CONFLICT.

    Raises:
        ConfigurationError: naming the table if it does not exist, has no
            usable key (a deferrable one is not: ON CONFLICT refuses it), or
            ``key`` names unknown columns.
    """
    with conn.cursor() as cur:
        if schema is None:
            row = cur.execute("SELECT current_schema()").fetchone()
            schema = str(row[0]) if row and row[0] else "public"
        found = cur.execute(
            "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (schema, table),
        ).fetchone()
        if found is None:
            raise ConfigurationError(
                f"postgres sink: target table {schema}.{table} does not exist "
                "(or is not a table); nothing was written",
                table=f"{schema}.{table}",
            )
        oid = found[0]
        columns = {
            r[0]: Column(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8])
            for r in cur.execute(_COLUMNS_SQL, (oid,)).fetchall()
        }
        found_keys = cur.execute(_KEYS_SQL, (oid,)).fetchall()
    unique_keys = [(bool(r[0]), tuple(r[1])) for r in found_keys]
    immediate = [set(r[1]) for r in found_keys if r[2]]
    display = f"{schema}.{table}"
    if key is not None:
        unknown = [c for c in key if c not in columns]
        if unknown:
            raise ConfigurationError(
                f"postgres sink: key column {unknown[0]!r} is not a column of table {display}",
                table=display,
                column=unknown[0],
            )
        if not any(set(k) == set(key) for _, k in unique_keys):
            raise ConfigurationError(
                f"postgres sink: key {list(key)} of table {display} is not covered by a "
                "primary key or unique index; upserts need one (ON CONFLICT)",
                table=display,
            )
        chosen = tuple(key)
    elif unique_keys and unique_keys[0][0]:
        chosen = unique_keys[0][1]
    else:
        raise ConfigurationError(
            f"postgres sink: table {display} has no primary key; give key=(...) columns "
            "covered by a unique index",
            table=display,
        )
    check_sql_keys(
        f"postgres sink: table {display}",
        {c: col.sql_type for c, col in columns.items()},
        chosen,
        ConfigurationError,
    )
    if set(chosen) not in immediate:
        # ON CONFLICT cannot use a deferrable unique index as its arbiter: every
        # epoch would fail the same way, so say so now.
        raise ConfigurationError(
            f"postgres sink: key {list(chosen)} of table {display} is covered only by a "
            "DEFERRABLE unique index, which INSERT ... ON CONFLICT cannot use; make it NOT "
            "DEFERRABLE or give key=(...) columns covered by an immediate unique index",
            table=display,
        )
    return TableSchema(schema=schema, table=table, columns=columns, key=chosen)


# Everything that makes a COPY into the table behave differently from the
# INSERT ... SELECT ... ON CONFLICT of the general path:
# - rules: COPY ignores them (an INSERT rule never fires);
# - triggers (in the whole partition tree): COPY fires row and INSERT statement
#   triggers, but not the UPDATE statement triggers that ON CONFLICT DO UPDATE
#   fires; FK and other internal constraint triggers behave alike and are ignored;
# - row security (enabled or forced): COPY FROM refuses it outright;
# - identity and generated columns among those written: COPY writes a value
#   into a GENERATED ALWAYS identity column without OVERRIDING SYSTEM VALUE.
_BLOCKERS_SQL = """
SELECT ARRAY(SELECT 'rule ' || quote_ident(r.rulename) FROM pg_rewrite r
              WHERE r.ev_class = c.oid AND r.rulename <> '_RETURN' ORDER BY r.rulename)
    || ARRAY(SELECT 'trigger ' || quote_ident(g.tgname) FROM pg_trigger g
              WHERE (g.tgrelid = c.oid
                     OR g.tgrelid IN (SELECT relid FROM pg_catalog.pg_partition_tree(c.oid)))
                AND NOT g.tgisinternal AND g.tgenabled <> 'D' ORDER BY g.tgname)
    || ARRAY(SELECT 'row level security' WHERE c.relrowsecurity OR c.relforcerowsecurity)
    || ARRAY(SELECT CASE WHEN a.attidentity <> '' THEN 'identity column '
                         ELSE 'generated column ' END || quote_ident(a.attname)
               FROM pg_attribute a
              WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                AND a.attname = ANY(%(columns)s::text[])
                AND (a.attidentity <> '' OR a.attgenerated <> '') ORDER BY a.attnum)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relname = %(table)s
"""


def direct_copy_blockers(
    cur: psycopg.Cursor[Any],
    schema: TableSchema,
    columns: tuple[str, ...],
    *,
    allow_triggers: bool = False,
) -> list[str]:
    """What makes a COPY straight into the target differ from the general upsert path.

    Read inside the epoch txn, after the caller has locked the table in ROW
    EXCLUSIVE mode: every DDL that adds a rule, trigger, policy or identity
    conflicts with that lock, so the answer holds until the txn ends (a
    reflection cached at setup() could be stale).

    Args:
        cur: a cursor in the epoch txn.
        schema: the target.
        columns: the columns the COPY would write.
        allow_triggers: the user accepts that COPY fires the table's triggers
            as a plain INSERT would (not the UPDATE statement triggers of ON
            CONFLICT DO UPDATE).

    Returns:
        One phrase per blocker ('rule "audit"', 'row level security', ...);
        empty if the COPY is equivalent. A vanished table counts as a blocker.
    """
    row = cur.execute(
        _BLOCKERS_SQL, {"schema": schema.schema, "table": schema.table, "columns": list(columns)}
    ).fetchone()
    if row is None:
        return ["the table is gone"]
    found = [str(b) for b in row[0]]
    if allow_triggers:
        found = [b for b in found if not b.startswith("trigger ")]
    return found
