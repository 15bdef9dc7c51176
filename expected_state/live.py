"""The live data files of a store table's snapshot, classified, and where its epochs were folded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.layout import StoreFile, classify

__all__ = ["base_through", "fold_point", "live_files"]


def live_files(table: DeltaTable, *, name: str) -> list[StoreFile]:
    """The live data files of ``table``'s snapshot, classified (change files by epoch)."""
    actions = pa.table(table.get_add_actions(flatten=False)).select(
        ["path", "size_bytes", "num_records"]
    )
    base = table.table_uri.rstrip("/")
    files = [
        replace(classify(f"{base}/{path}", path, int(size or 0), table=name), rows=rows)
        for path, size, rows in zip(
            actions.column("path").to_pylist(),
            actions.column("size_bytes").to_pylist(),
            actions.column("num_records").to_pylist(),
            strict=True,
        )
    ]
    return sorted(files, key=lambda f: (f.kind != "base", f.epoch, f.path))


def base_through(files: Sequence[StoreFile]) -> int | None:
    """The epoch the live base was folded through (None: no base yet)."""
    through = [f.epoch for f in files if f.kind == "base"]
    return max(through) if through else None


def fold_point(files: Sequence[StoreFile]) -> int | None:
    """The newest epoch whose own changes no longer have a file of their own.

    The base and merged change files hold the newest change of each key over
    their epochs: a state as of an earlier epoch cannot be read from them.
    """
    folded = [f.epoch for f in files if f.kind == "base" or f.merged]
    return max(folded) if folded else None
