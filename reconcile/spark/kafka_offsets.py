"""A Kafka-fed micro-batch's offsets, read from the stream's checkpoint, and kept in the store.

Spark writes a micro-batch's end offsets to its offset log (``<checkpoint>/
offsets/<batch>``: a version line, the batch's metadata, one line per source)
before it runs the batch; a Kafka source's line is ``{"topic": {"partition":
offset}}``. The batch read ``[end of the batch before, its own end)``; the first
batch starts at the source's initial offsets (``<checkpoint>/sources/<i>/0``).
A re-run of a batch after a crash reads the same offsets (Spark fixes them in
the offset log before the batch runs), so recording them twice is a no-op.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from expected_state.source_offsets import OffsetRange

__all__ = ["batch_offsets"]


def _local(path: str) -> Path:
    parsed = urlparse(path)
    return Path(parsed.path) if parsed.scheme in ("", "file") else Path(path)


def _kafka_offsets(line: str) -> dict[str, dict[int, int]] | None:
    """A source line as ``{topic: {partition: offset}}``; None if it is not a Kafka source's."""
    try:
        found: Any = json.loads(line)
    except ValueError:
        return None
    if not isinstance(found, dict) or not found:
        return None
    offsets: dict[str, dict[int, int]] = {}
    for topic, partitions in found.items():
        if not isinstance(partitions, dict):
            return None
        try:
            offsets[topic] = {int(p): int(o) for p, o in partitions.items()}
        except (TypeError, ValueError):
            return None
    return offsets


def _source_lines(path: Path) -> list[str]:
    """The source lines of an offset-log entry (after its version and metadata lines)."""
    return path.read_text().splitlines()[2:]


def _initial(checkpoint: Path, source: int) -> dict[str, dict[int, int]] | None:
    """A Kafka source's initial offsets (``sources/<i>/0``: a NUL, a version line, the JSON)."""
    path = checkpoint / "sources" / str(source) / "0"
    if not path.exists():
        return None
    lines = path.read_bytes().lstrip(b"\x00").decode().splitlines()
    return _kafka_offsets(lines[1]) if len(lines) > 1 else None


def batch_offsets(checkpoint: str, batch_id: int) -> list[OffsetRange] | None:
    """The offset ranges micro-batch ``batch_id`` read, per topic and partition.

    None when the stream's sources are not all Kafka sources, or the offset log
    has no entry for the batch (a source of another kind keeps no offsets that
    say which records a batch read).
    """
    root = _local(checkpoint)
    entry = root / "offsets" / str(batch_id)
    if not entry.exists():
        return None
    ends = [_kafka_offsets(line) for line in _source_lines(entry)]
    if not ends or any(end is None for end in ends):
        return None
    before = root / "offsets" / str(batch_id - 1)
    if batch_id > 0 and before.exists():
        starts = [_kafka_offsets(line) for line in _source_lines(before)]
    else:
        starts = [_initial(root, i) for i in range(len(ends))]
    ranges: list[OffsetRange] = []
    for i, end in enumerate(ends):
        assert end is not None
        start = starts[i] if i < len(starts) else None
        for topic, partitions in end.items():
            for partition, to_offset in partitions.items():
                # A partition new since the batch before starts at its beginning.
                from_offset = ((start or {}).get(topic) or {}).get(partition, 0)
                ranges.append(OffsetRange(topic, partition, min(from_offset, to_offset),
                                          to_offset))  # fmt: skip
    return sorted(ranges)
