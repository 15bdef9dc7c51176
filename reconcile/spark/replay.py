"""A stream's retained input replayed in batch, micro-batch by micro-batch, under new logic.

A rebuild (``reconcile.rebuild``) needs each sink table's expected state as a
fresh run of the new logic would leave it as of the newest decided epoch E.
For a file source the stream's checkpoint says exactly which files each
micro-batch read (``<checkpoint>/sources/0``, Spark's file source log). This
module reads that log, then, for each micro-batch up to E in order, calls the
app with a session whose ``readStream`` reads that micro-batch's files in
batch, applies each sink's transform as the stream would (with the batch
id), collects the rows, and keeps the last row of each key: what the commit
cycle's upserts leave. Per micro-batch, not over the union of the files,
because a transform of a micro-batch (an aggregate, a dedup) means what it
does within one batch.

A Kafka source keeps no file list: its micro-batches are read again from the
offsets the store recorded for each epoch (``replay_kafka``). Other sources
(a rate source, a table) are refused, naming the checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from expected_state.merge import last_per_key
from expected_state.source_offsets import OffsetRange
from reconcile.core.contract import ConfigurationError, InvalidInputError
from reconcile.spark.outputs import apply_transform, identity
from reconcile.spark.staging import arrow_schema

__all__ = ["BatchSession", "file_source_batches", "replay"]

log = logging.getLogger("reconcile.rebuild")

# Options of a streaming file source that a batch read does not take.
_STREAM_ONLY = frozenset(
    {"maxfilespertrigger", "maxbytespertrigger", "latestfirst", "maxfileage", "cleansource",
     "sourcearchivedir", "filenameonly", "maxcachedfiles", "discardcachedinputratio"}
)  # fmt: skip


def _local(path: str) -> Path:
    parsed = urlparse(path)
    return Path(parsed.path) if parsed.scheme in ("", "file") else Path(path)


def _has_file_log(checkpoint: str) -> bool:
    """Whether the checkpoint's only source keeps a file list (its log names files)."""
    folder = _local(checkpoint) / "sources" / "0"
    entries = sorted(folder.glob("[0-9]*")) if folder.is_dir() else []
    for entry in entries:
        for line in entry.read_bytes().lstrip(b"\x00").decode(errors="replace").splitlines()[1:]:
            return '"path"' in line
    return True  # no entries: let file_source_batches say what is wrong


def file_source_batches(checkpoint: str, through: int) -> dict[int, list[str]]:
    """Micro-batch id -> the files it read, for every micro-batch up to ``through``.

    Read from the file source log of the stream's only source
    (``<checkpoint>/sources/0``): ``N`` files and the ``N.compact`` files that
    fold the earlier ones, each a ``v1`` line and one JSON object per file.

    Raises:
        ConfigurationError: no file source log in the checkpoint (not a file
            source, or another checkpoint), several sources, or a micro-batch
            up to ``through`` with no entry (the log was cleaned past it).
    """
    sources = _local(checkpoint) / "sources"
    logs = sorted(p.name for p in sources.iterdir()) if sources.is_dir() else []
    if logs != ["0"]:
        raise ConfigurationError(
            f"checkpoint {checkpoint}: a rebuild replays a stream of one file source, whose "
            f"log is sources/0 there; found {logs or 'no source log'}"
        )
    batches: dict[int, list[str]] = {}
    # N and N.compact; not Spark's temporary and checksum files (".N.crc").
    entries = [p for p in (sources / "0").iterdir() if p.name.split(".")[0].isdigit()]
    for entry in sorted(entries, key=lambda p: int(p.name.split(".")[0])):
        lines = entry.read_text().splitlines()
        if not lines or not lines[0].startswith("v"):
            raise ConfigurationError(f"checkpoint {checkpoint}: {entry} is not a file source log")
        for line in lines[1:]:
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record, dict) or "path" not in record or "batchId" not in record:
                raise ConfigurationError(
                    f"checkpoint {checkpoint}: {entry} is not a file source log (its source keeps "
                    "no file list): name the retained input in the run table's rebuild_input"
                )
            batch = int(record["batchId"])
            if batch <= through:
                paths = batches.setdefault(batch, [])
                if record["path"] not in paths:
                    paths.append(record["path"])
    missing = sorted(set(range(min(batches, default=0), through + 1)) - set(batches))
    if not batches or missing:
        raise ConfigurationError(
            f"checkpoint {checkpoint}: the file source log lacks micro-batches {missing or '0..'}"
            f"{through}: a rebuild needs the files of every micro-batch up to epoch {through}"
        )
    return dict(sorted(batches.items()))


class _BatchReader:
    """``spark.readStream``'s builder, reading one micro-batch's files (or offsets) in batch."""

    def __init__(self, spark: Any, source: Sequence[str] | Sequence[OffsetRange]) -> None:
        self._spark = spark
        self._files = [s for s in source if isinstance(s, str)]
        self._ranges = [s for s in source if isinstance(s, OffsetRange)]
        self._format: str | None = None
        self._schema: Any = None
        self._options: dict[str, Any] = {}
        # Every micro-batch's offsets, checked against the topic's retention once
        # (by the first micro-batch's read); None: checked already, or files.
        self._check: Mapping[int, Sequence[OffsetRange]] | None = None

    def format(self, source: str) -> _BatchReader:
        self._format = source
        return self

    def schema(self, schema: Any) -> _BatchReader:
        self._schema = schema
        return self

    def option(self, key: str, value: Any) -> _BatchReader:
        self._options[key] = value
        return self

    def options(self, **options: Any) -> _BatchReader:
        self._options.update(options)
        return self

    def load(self, path: str | None = None, format: str | None = None, schema: Any = None,
             **options: Any) -> Any:  # fmt: skip
        source = format or self._format or "parquet"
        if source == "kafka":
            return self._kafka({**self._options, **options})
        reader = self._spark.read.format(source)
        if (schema or self._schema) is not None:
            reader = reader.schema(schema or self._schema)
        wanted = {**self._options, **options}
        reader = reader.options(**{k: v for k, v in wanted.items()
                                   if k.lower() not in _STREAM_ONLY})  # fmt: skip
        return reader.load(self._files)

    def _kafka(self, options: Mapping[str, Any]) -> Any:
        from reconcile.spark.replay_kafka import check_retained, kafka_read

        if self._files:
            raise ConfigurationError(
                "the app reads Kafka, but the checkpoint's source log lists files: the app "
                "is not the one that wrote this checkpoint"
            )
        if self._check is not None:
            client = {k[len("kafka.") :]: v for k, v in options.items()
                      if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}  # fmt: skip
            check_retained(str(options.get("kafka.bootstrap.servers", "")), self._check, client)
        return kafka_read(self._spark, options, self._ranges)

    def json(self, path: str, schema: Any = None, **options: Any) -> Any:
        return self.load(path, "json", schema, **options)

    def csv(self, path: str, schema: Any = None, **options: Any) -> Any:
        return self.load(path, "csv", schema, **options)

    def parquet(self, path: str, **options: Any) -> Any:
        return self.load(path, "parquet", **options)

    def orc(self, path: str, **options: Any) -> Any:
        return self.load(path, "orc", **options)

    def text(self, path: str, **options: Any) -> Any:
        return self.load(path, "text", **options)


class BatchSession:
    """A SparkSession whose ``readStream`` reads one micro-batch's files (or offsets) in batch."""

    def __init__(
        self,
        spark: Any,
        source: Sequence[str] | Sequence[OffsetRange],
        check: Mapping[int, Sequence[OffsetRange]] | None = None,
    ) -> None:
        self._spark, self._source, self._check = spark, source, check

    @property
    def readStream(self) -> _BatchReader:
        """This micro-batch's input, read in batch, whatever the app asks to stream."""
        reader = _BatchReader(self._spark, self._source)
        reader._check = self._check
        return reader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark, name)


def _are_files(source: Sequence[str] | Sequence[OffsetRange]) -> bool:
    return all(isinstance(s, str) for s in source)


def _rows(frame: Any) -> pa.Table:
    if isinstance(frame, pa.Table):
        return frame
    table = frame.toArrow()
    schema = arrow_schema(frame)  # toArrow() labels timestamps UTC; the stream's types
    return table if table.schema.equals(schema) else table.cast(schema)


def _batches(
    spark: Any,
    app: Callable[[Any], tuple[Any, Mapping[str, Any] | None]],
    batches: Mapping[int, Sequence[str] | Sequence[OffsetRange]],
    sinks: Sequence[str],
) -> Iterator[tuple[int, dict[str, pa.Table]]]:
    first = True
    for batch_id, source in batches.items():
        # Offsets are checked against the topic's retention once, before the
        # first micro-batch reads anything.
        check: Any = batches if first and not _are_files(source) else None
        first = False
        frame, outputs = app(BatchSession(spark, source, check))
        transforms = outputs or {}
        rows = {}
        for sink in sinks:
            made = apply_transform(transforms.get(sink, identity), frame, batch_id, sink=sink)
            rows[sink] = _rows(made)
        yield batch_id, rows


def replay(
    spark: Any,
    app: Callable[[Any], tuple[Any, Mapping[str, Any] | None]],
    checkpoint: str,
    through: int,
    tables: Mapping[str, tuple[Sequence[str], Sequence[str]]],
    on_batch: Callable[[int, int], None] | None = None,
    retained: str | None = None,
    store: tuple[str, str] | None = None,
) -> dict[str, pa.Table]:
    """Each sink table's state after the micro-batches up to ``through``, under ``app``.

    With ``retained`` (the config's ``run.rebuild_input``: a folder or file of the
    retained input, for a stream whose source keeps no file list), the app reads
    that whole, as one batch numbered ``through``, instead. Its keys are not
    folded: which of two rows of a key came last is not known without the
    micro-batches, so a key that repeats is refused by the rebuild, named.

    Args:
        spark: the SparkSession.
        app: session -> (DataFrame, {sink: transform} or None), the pipeline's app
            called on a ``BatchSession``.
        checkpoint: the stream's checkpoint folder.
        through: the newest decided epoch (= micro-batch id).
        tables: sink -> (its key columns, its columns as the store holds them).
        on_batch: called with (micro-batches done, in all) after each.
        store: (the store's root, the pipeline): a stream whose checkpoint keeps no
            file list (a Kafka source) is replayed from the offsets the store
            recorded for each epoch (``reconcile.spark.replay_kafka``).

    Returns:
        sink -> its rows, one per key (the last one written).

    Raises:
        ConfigurationError: see ``file_source_batches``.
        InvalidInputError: a transform's rows lack a column of the table (named).
    """
    batches: dict[int, Sequence[str] | Sequence[OffsetRange]]
    if retained is not None:
        batches = {through: [retained]}
    elif store is not None and not _has_file_log(checkpoint):
        from reconcile.spark.replay_kafka import kafka_batches

        batches = dict(kafka_batches(store[0], store[1], through))
    else:
        batches = dict(file_source_batches(checkpoint, through))
    parts: dict[str, list[pa.Table]] = {sink: [] for sink in tables}
    for done, (batch_id, rows) in enumerate(_batches(spark, app, batches, list(tables)), 1):
        for sink, table in rows.items():
            columns = list(tables[sink][1])
            lacking = [c for c in columns if c not in table.column_names]
            if lacking:
                raise InvalidInputError(
                    f"rebuild of sink {sink!r}: micro-batch {batch_id}'s rows under the new "
                    f"logic lack columns {lacking} of the table ({columns})"
                )
            parts[sink].append(table.select(columns))
        if on_batch is not None:
            on_batch(done, len(batches))
    state = {}
    for sink, chunks in parts.items():
        keys = list(tables[sink][0])
        rows = pa.concat_tables(chunks, promote_options="permissive")
        # The last write of a key wins, as in the sink; one batch of everything
        # has no order to tell which came last, and is left for the rebuild to refuse.
        state[sink] = rows if retained is not None else last_per_key(rows, keys)
    log.info("replayed %d micro-batches of %s up to epoch %d", len(batches),
             retained or checkpoint, through)  # fmt: skip
    return state
