"""Full mode in bounded memory: both sides split by key hash, spilled, diffed part by part.

A full verify compares every row of the sink with every expected row. Held
whole, a 60-million-row table needs more memory than the machine has. Here:

1. the sink's rows are pulled in one query, as today, and each batch is
   conformed and hashed as it arrives; only its keys and row hashes are kept,
   spilled to the part their key hashes to;
2. the store's snapshot is read the same way (``snapshot_parts``): its files
   streamed, spilled by key, and each part merged alone; the files are read on
   a thread of their own while the sink is pulled (``ahead.read_ahead``);
3. part by part, the expected keys and hashes are diffed with the sink's, and
   only what differs is kept (with the expected values, for a repair).

Equal keys land in the same part on both sides (the sink's keys are cast to
the expected state's types first), so the union of the parts' diffs is the
diff of the tables: the same missing, extra and changed keys, repeats of a key
included. The peak memory is one part of each side, set by ``chunk_rows``.
"""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core import hooks, interrupts
from reconcile.core.conform import conform, hash_pulled
from reconcile.core.spill import SpilledParts, parts_of
from reconcile.core.target import Progress, SinkSnapshot
from reconcile.recovery.ahead import read_ahead
from reconcile.recovery.diff import HASH, Diff, diff_tables
from reconcile.recovery.source import ExpectedSource, semi
from reconcile.recovery.steps import DIFFING, PULLING, check_step

__all__ = ["PART", "diff_in_parts", "hashed_rows"]

# Before each part's diff, both sides of it spilled: a signal here removes the
# spilled parts and writes nothing.
PART = hooks.declare("recovery.part")


def hashed_rows(raw: pa.Table, schema: pa.Schema, keys: list[str]) -> pa.Table:
    """Keys and row hash of pulled rows, conformed to the expected state's types."""
    rows, bad = conform(raw, schema)
    return rows.select(keys).append_column(HASH, hash_pulled(rows, bad, schema.names))


def diff_in_parts(
    snap: SinkSnapshot,
    source: ExpectedSource,
    schema: pa.Schema,
    keys: list[str],
    epoch: int,
    progress: Progress | None,
    *,
    parts: int,
    where: str | None,
) -> tuple[Diff, pa.Table, int]:
    """(the diff, the expected rows of the keys to write, the sink rows pulled).

    The expected rows carry the values when ``source.values`` (a repair);
    otherwise they are the differing keys' hashes. The pull and the diff are
    steps named for an interruption (``steps.check_step``).
    """
    spilled_schema = pa.schema(
        [*(schema.field(k).with_nullable(True) for k in keys), pa.field(HASH, pa.int64())]
    )
    names = [*schema.names, HASH] if source.values else [*keys, HASH]
    pulled = 0
    missing: list[pa.Table] = []
    extra: list[pa.Table] = []
    changed: list[pa.Table] = []
    wanted: list[pa.Table] = []
    shape: pa.Schema | None = None
    # The store's parts are read while the sink is pulled (``read_ahead``): its
    # first part costs one read of every file of the snapshot.
    store_parts = source.store.snapshot_parts(epoch, names, parts=parts, where=where)
    with (
        SpilledParts(spilled_schema, parts, where=where, name="sink") as sink,
        read_ahead(store_parts) as expected_parts,
    ):

        def each(raw: pa.Table) -> None:
            nonlocal pulled
            pulled += raw.num_rows
            actual = hashed_rows(raw, schema, keys)
            sink.add(actual, parts_of(actual, keys, parts))

        with check_step("the pull", PULLING):
            snap.pull_each(each, progress)
        with check_step("the diff", DIFFING):
            for part, expected in expected_parts:
                # Between parts: a signal whose exception a library swallowed is raised here.
                interrupts.check()
                hooks.point(PART)
                shape = expected.schema
                diff = diff_tables(expected.select([*keys, HASH]), sink.read(part), keys)
                missing.append(diff.missing)
                extra.append(diff.extra)
                changed.append(diff.changed)
                differing = pa.concat_tables([diff.missing, diff.changed])
                if differing.num_rows:
                    wanted.append(semi(expected, differing, keys))
    key_schema = pa.schema([schema.field(k) for k in keys])

    def joined(tables: list[pa.Table]) -> pa.Table:
        if not tables:
            return key_schema.empty_table()
        return pa.concat_tables([t.cast(tables[0].schema) for t in tables])

    diff = Diff(joined(missing), joined(extra), joined(changed))
    if wanted:
        rows = pa.concat_tables(wanted)
    else:
        rows = (shape or pa.schema([*key_schema, pa.field(HASH, pa.int64())])).empty_table()
    return diff, rows, pulled
