"""The options of the Spark entries, each one frozen value: a streaming query, a verify job."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from reconcile.engine.driver import RetryPolicy
from reconcile.recovery.brake import Brake
from reconcile.recovery.provenance import DEFAULT_PROVENANCE_ROWS
from reconcile.spark.outputs import Transform

__all__ = ["SparkRecoverKeywords", "SparkRecoverOptions", "StreamKeywords", "StreamOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamOptions:
    """The options of a streaming query that writes through the commit cycle.

    ``write_stream`` and ``HaNode`` take them as keywords (typed by
    :class:`StreamKeywords`) and keep them as this one value.

    Attributes:
        checkpoint: Spark's checkpoint folder; restart the query with the same
            one (and the same ``build``) to resume.
        staging: where executors stage rows (see ``StreamWriter``); every
            executor and the driver must see it at this path.
        outputs: sink name -> transform of the micro-batch; default: the batch
            itself into every sink.
        trigger: ``DataStreamWriter.trigger`` keyword arguments, e.g.
            ``{"processingTime": "1 second"}`` or ``{"availableNow": True}``;
            default: the next micro-batch as soon as the last one is done.
        query_name: the query's name in Spark's UI and metrics.
        retry: how long an epoch is retried before the query fails.
        via: how each micro-batch's rows are staged: "auto", "executors" or
            "driver" (see ``StreamWriter``).
        collect_max_bytes: the largest input estimate ``via="auto"`` collects;
            None: the writer's default (``COLLECT_MAX_BYTES``).
    """

    checkpoint: str | os.PathLike[str]
    staging: str | os.PathLike[str]
    outputs: Mapping[str, Transform] | None = None
    trigger: Mapping[str, Any] | None = None
    query_name: str | None = None
    retry: RetryPolicy | None = None
    via: str = "auto"
    collect_max_bytes: int | None = None


class _StreamPlaces(TypedDict):
    """The keywords every streaming query needs (the folders it writes in)."""

    checkpoint: str | os.PathLike[str]
    staging: str | os.PathLike[str]


class StreamKeywords(_StreamPlaces, total=False):
    """The keywords of :class:`StreamOptions`, for ``**options`` (see its attributes)."""

    outputs: Mapping[str, Transform] | None
    trigger: Mapping[str, Any] | None
    query_name: str | None
    retry: RetryPolicy | None
    via: str
    collect_max_bytes: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SparkRecoverOptions:
    """How ``spark_recover`` verifies (or repairs) a table on Spark.

    Attributes:
        sink: the sink's name (its store table and markers); default the table's name.
        keys: the key columns; default the table's primary key.
        schema: the table's schema, if not in ``table``.
        dry_run: only report (the default, ``verify``); False repairs.
        partitions: key ranges pulled in parallel; default Spark's default parallelism.
        batch_rows: rows per repair transaction.
        samples: keys shown per kind of difference.
        brake: the mass-change brake (``reconcile.recovery.brake``); default 10 %.
        provenance_rows: differing rows traced to their last writer on the driver
            (``reconcile.recovery.provenance``); 0 traces none.
        store_reader: how the executors read the expected state: "delta-spark"
            (Spark's own Delta reader, at the store's version of the epoch),
            "files" (the data files of that version, listed from the Delta log
            by the driver), or "auto": delta-spark when the session carries its
            JARs (every session ``reconcile.spark.session`` starts does).
    """

    sink: str | None = None
    keys: Sequence[str] | None = None
    schema: str | None = None
    dry_run: bool = True
    partitions: int | None = None
    batch_rows: int = 50_000
    samples: int = 5
    brake: Brake | None = None
    provenance_rows: int = DEFAULT_PROVENANCE_ROWS
    store_reader: str = "auto"


class SparkRecoverKeywords(TypedDict, total=False):
    """The keywords of :class:`SparkRecoverOptions`, for ``**options`` (see its attributes)."""

    sink: str | None
    keys: Sequence[str] | None
    schema: str | None
    dry_run: bool
    partitions: int | None
    batch_rows: int
    samples: int
    brake: Brake | None
    provenance_rows: int
    store_reader: str
