"""Clear what a killed driver left half-written in a streaming query's checkpoint.

Spark writes each entry of a checkpoint's offset and commit logs to a hidden
temporary file (``commits/.0.<uuid>.tmp``, with Hadoop's ``..0.<uuid>.tmp.crc``
beside it) and renames it into place (``commits/0``). A driver killed between
the two leaves the temporary files and no entry. Under Real-Time Mode that
happens at a long batch's end, before any entry of batch 0 is in place, and
Spark 4.2 then refuses every restart on the checkpoint
(``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``: the commit log "should be empty
on batch 0"), so the query could never run again without a hand edit.

Such a file was never renamed into place: no reader of the checkpoint has seen
it, and the batch it would have recorded runs again from its start offsets on
the restart, which the real-time writer's offset markers make harmless (each
record at or below its partition's marker is skipped). Only those files are
removed, matched by the exact names Spark's ``CheckpointFileManager`` gives
them; an entry in place is never touched. A second driver running on the same
checkpoint at that moment (never a supported setup: Spark keeps no lock across
processes) would see its own pending write fail, and stop, which is the safe
outcome for a zombie.

The checkpoint is reached through Hadoop's ``FileSystem`` in the session's JVM,
the one Spark itself writes with, so a checkpoint on S3 or HDFS is cleared the
same way as a local folder.
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["LOGS", "clear_interrupted_writes"]

log = logging.getLogger("reconcile.spark.checkpoint")

# The checkpoint's logs whose entries are written through a temporary file.
LOGS = ("offsets", "commits")
# ``.<batch>.<uuid>.tmp`` and its checksum ``..<batch>.<uuid>.tmp.crc``: the names
# CheckpointFileManager.createAtomic gives an entry before its rename.
_TEMPORARY = re.compile(
    r"^\.{1,2}\d+\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.tmp(\.crc)?$"
)


def is_interrupted_write(name: str) -> bool:
    """Whether ``name`` (a file's base name in a checkpoint log) is a pending entry."""
    return _TEMPORARY.match(name) is not None


def clear_interrupted_writes(spark: Any, checkpoint: str) -> list[str]:
    """Remove the checkpoint's pending log entries; returns the paths removed.

    Meant to run on the driver before the query starts on ``checkpoint``. A
    checkpoint that does not exist yet has nothing to clear.
    """
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    root = jvm.org.apache.hadoop.fs.Path(checkpoint)
    fs = root.getFileSystem(conf)
    removed: list[str] = []
    for name in LOGS:
        folder = jvm.org.apache.hadoop.fs.Path(root, name)
        if not fs.exists(folder):
            continue
        for status in fs.listStatus(folder):
            path = status.getPath()
            if status.isFile() and is_interrupted_write(path.getName()):
                fs.delete(path, False)
                removed.append(path.toString())
    if removed:
        # Said once per restart: the batch those entries were for runs again.
        log.warning(
            "the checkpoint %s held %d log entries a killed driver left half-written "
            "(removed, never read): %s; the batch they were for runs again from its start",
            checkpoint, len(removed), ", ".join(sorted(removed)),
        )  # fmt: skip
    return removed
