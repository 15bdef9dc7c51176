"""Which of delta-rs's failures are refusals that every retry repeats, named for an operator.

delta-rs raises a schema it cannot take (a type Delta has no type for, two
column names equal but for case, a field it cannot merge) as a plain
``Exception`` or a ``DeltaError`` whose text begins "Schema error", naming no
table, and the same commit fails the same way however often it is retried. The
commit cycle would take such a failure at the commit point for an outcome it
cannot know and restart, again and again, until its retry budget ran out.
``store_refusal`` sorts them out: a ``ConfigurationError`` (terminal in
``reconcile.core.decisions.classify``), one line naming the store table, what
it refused and delta-rs's reason. Every other failure (a lost race, an I/O
error, a store away) is left as it is, to be retried.
"""

from __future__ import annotations

import re

from deltalake.exceptions import SchemaMismatchError

from reconcile.core.contract import ConfigurationError

__all__ = ["store_refusal"]

# delta-rs's words for a schema it refuses (the kernel's SchemaError, arrow's
# schema errors, a merge without type widening). Checked before the commit is
# attempted, so nothing of it was written.
_SCHEMA_REFUSAL = re.compile(
    r"Schema error|Invalid data type for Delta Lake|Duplicate field name|Cannot merge field|"
    r"Schema mismatch|Failed to convert into Arrow schema",
    re.IGNORECASE,
)


def store_refusal(exc: BaseException, *, table: str, what: str) -> ConfigurationError | None:
    """``exc`` as a terminal error naming ``table``, if it is a refusal of the schema; else None.

    Args:
        exc: what delta-rs raised.
        table: the store table's URI.
        what: what was being written, e.g. "a table of these columns".
    """
    text = str(exc)
    if not isinstance(exc, SchemaMismatchError) and not _SCHEMA_REFUSAL.search(text):
        return None
    # delta-rs appends a native backtrace to some messages: its first line says it.
    reason = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return ConfigurationError(
        f"expected-state store table {table!r} refuses {what}: {reason}; every retry would be "
        "refused the same way, so the pipeline stops; nothing was written",
        table=table,
    )
