"""The rebuild log: the steps of every rebuild of a pipeline, durable in the store (``_rebuilds``).

A rebuild (``reconcile.rebuild``) converges a pipeline's sinks to new logic in
steps that cannot be one transaction: the store of each table, then each
sink in bounded transactions. Between them the pipeline is a mix of two
logics; this log names the mix: which rebuild, from which logic version to
which, how far it got. While its newest entry is unfinished no writer may
start (``ExpectedState.check_rebuilds``), so nothing runs on a mix; the
rebuild is resumed or rolled back.

One Delta table ``<root>/_rebuilds`` for every pipeline of the store, one row
per step, appended in ONE commit each whose token is
``Transaction("<pipeline>#rebuilds", seq)``: two writers racing for the same
step number cannot both land. A row carries the writer generation; the state
is the row with the highest (generation, seq), so a step a fenced-off writer
appends late is never the state.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.delta_commit import DeltaCommit, commit_files
from expected_state.delta_files import write_data_file
from expected_state.rebuild_audit import audited_rows, check_rebases, steps_app_id
from reconcile.core.contract import RetryableError, validate_name

__all__ = ["FINISHED", "REBUILDS_TABLE", "STEPS", "RebuildEntry", "RebuildLog"]

REBUILDS_TABLE = "_rebuilds"
# In order: the rebuild began (its plan taken, nothing written); every store
# table rebased; every sink applied; the new logic is the pipeline's. Or, from
# any of the first three: rolled back, the old logic the pipeline's again.
STEPS = ("started", "stored", "applied", "switched", "rolled_back")
FINISHED = ("switched", "rolled_back")

_SCHEMA = pa.schema(
    [
        pa.field("pipeline", pa.string(), nullable=False),
        pa.field("rebuild", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("generation", pa.int64(), nullable=False),
        pa.field("step", pa.string(), nullable=False),
        pa.field("logic_version", pa.string(), nullable=False),
        pa.field("previous", pa.string(), nullable=True),
        pa.field("base_epoch", pa.int64(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("at_ms", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True)
class RebuildEntry:
    """One step of one rebuild.

    Attributes:
        pipeline: the pipeline.
        rebuild: the rebuild's id (every step of one rebuild shares it).
        seq: the step's number in the pipeline's log.
        generation: the writer generation that wrote it.
        step: one of ``STEPS``.
        logic_version: the logic the rebuild brings.
        previous: the logic in force before it (None: never named).
        base_epoch: the newest decided epoch, which the new state is as of.
        detail: per table: the store versions before and after, the plan's counts.
        at_ms: when it was written (ms since the epoch, this host's clock).
    """

    pipeline: str
    rebuild: str
    seq: int
    generation: int
    step: str
    logic_version: str
    previous: str | None
    base_epoch: int
    detail: dict[str, Any] = field(default_factory=dict)
    at_ms: int = 0

    @property
    def finished(self) -> bool:
        """Whether the pipeline runs one logic again (switched or rolled back)."""
        return self.step in FINISHED

    @property
    def logic_in_force(self) -> str | None:
        """The logic version writers must run once this step is the newest."""
        return self.logic_version if self.step == "switched" else self.previous

    def describe(self) -> str:
        """One line for messages: which rebuild, from which logic to which, how far."""
        return (
            f"rebuild {self.rebuild} of pipeline {self.pipeline!r} from logic "
            f"{self.previous or '(unnamed)'!r} to {self.logic_version!r} as of epoch "
            f"{self.base_epoch}, at step {self.step!r} (generation {self.generation})"
        )


class RebuildLog:
    """The rebuild steps of ``pipeline`` in the store at ``root``."""

    def __init__(self, root: str, pipeline: str) -> None:
        self.root = str(root).rstrip("/")
        self.pipeline = validate_name("pipeline", pipeline)
        self.uri = f"{self.root}/{REBUILDS_TABLE}"
        self._app_id = steps_app_id(pipeline)

    def entries(self) -> list[RebuildEntry]:
        """Every step of this pipeline's rebuilds, in the order that decides the state.

        Each is checked first (``expected_state.rebuild_audit``): a step the
        engine did not write, a step removed, a file rewritten is refused.

        Raises:
            StoreIntegrityError: naming the step or file.
        """
        rows = audited_rows(self.root, self.uri, self.pipeline)
        found = [
            RebuildEntry(
                pipeline=r["pipeline"],
                rebuild=r["rebuild"],
                seq=int(r["seq"]),
                generation=int(r["generation"]),
                step=r["step"],
                logic_version=r["logic_version"],
                previous=r["previous"],
                base_epoch=int(r["base_epoch"]),
                detail=json.loads(r["detail"]),
                at_ms=int(r["at_ms"]),
            )
            for r in rows
        ]
        return sorted(found, key=lambda e: (e.generation, e.seq))

    def check_store(self, sinks: Iterable[str]) -> None:
        """Refuse store tables rebased by a rebuild this log does not hold (``rebuild_audit``).

        Raises:
            StoreIntegrityError: naming the table, its rebase and the step it began at.
        """
        check_rebases(self.root, self.uri, self.pipeline, sinks,
                      audited_rows(self.root, self.uri, self.pipeline))  # fmt: skip

    def newest(self) -> RebuildEntry | None:
        """The step that is the state: the highest (generation, seq); None: never rebuilt."""
        found = self.entries()
        return found[-1] if found else None

    def append(
        self,
        *,
        rebuild: str,
        generation: int,
        step: str,
        logic_version: str,
        previous: str | None,
        base_epoch: int,
        detail: dict[str, Any] | None = None,
    ) -> RebuildEntry:
        """Append one step, in ONE commit; the entry written.

        Raises:
            RetryableError: another writer appended a step meanwhile (the caller
                reads the log again and decides).
        """
        assert step in STEPS, step
        seq = max((e.seq for e in self.entries()), default=-1) + 1
        entry = RebuildEntry(
            self.pipeline,
            rebuild,
            seq,
            generation,
            step,
            logic_version,
            previous,
            base_epoch,
            dict(detail or {}),
            int(time.time() * 1000),
        )
        row = pa.table(
            {
                "pipeline": [entry.pipeline],
                "rebuild": [entry.rebuild],
                "seq": [seq],
                "generation": [generation],
                "step": [step],
                "logic_version": [logic_version],
                "previous": [previous],
                "base_epoch": [base_epoch],
                "detail": [json.dumps(entry.detail, sort_keys=True)],
                "at_ms": [entry.at_ms],
            },
            schema=_SCHEMA,
        )
        name = f"{self.pipeline}-{seq:08d}-{uuid.uuid4().hex[:8]}.parquet"
        written = write_data_file(self.uri, name, row)
        result = commit_files(
            DeltaCommit(
                table_uri=self.uri,
                schema=_SCHEMA,
                app_id=self._app_id,
                version=seq,
                add=[written],
                custom_metadata={"reconcile.rebuild_step": step},
            )
        )
        if not result.committed:
            raise RetryableError(
                f"pipeline {self.pipeline!r}: another writer wrote rebuild step {seq} "
                f"meanwhile; nothing was written ({entry.describe()})"
            )
        return entry
