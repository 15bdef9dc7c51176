"""The FileIO the Iceberg sink's catalog reads through: table metadata read up to a bound.

Every operation of the sink loads the table, and the catalog reads the
table's current metadata file whole (JSON: every snapshot's summary, every
property). Whoever can commit to the table can make that file any size: a
snapshot summary or a property of 300 MB costs about three times that in
memory at each load. So the catalog is given this FileIO (pyiceberg's
``py-io-impl``): pyarrow's own (``PyArrowFileIO``), which asks a metadata
file's size before anything reads it, and refuses one over
``reconcile.max-metadata-bytes`` (default ``MAX_METADATA_BYTES``) with an
ObjectTooLargeError naming the file and its size, unread. Data files, intent
files and manifests are read as pyarrow reads them.

Metadata files never change once written (a commit writes a new one), so
the size asked is the size read. The bound counts the file's bytes: a
gzip-compressed metadata file (``*.gz.metadata.json``) is bounded in its
compressed size.
"""

from __future__ import annotations

from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO
from pyiceberg.typedef import EMPTY_DICT, Properties

from reconcile.core.contract import ObjectTooLargeError

__all__ = ["IO_IMPL", "MAX_METADATA_BYTES", "MAX_METADATA_PROPERTY", "BoundedMetadataIO"]

# What the sink's table metadata legitimately weighs: about a kilobyte per
# snapshot, so 64 MiB is tens of thousands of snapshots (expire old ones long
# before: every load parses the whole file). A table that needs more sets the
# catalog property below.
MAX_METADATA_BYTES = 64 << 20
MAX_METADATA_PROPERTY = "reconcile.max-metadata-bytes"
IO_IMPL = "sinks.iceberg.bounded_io.BoundedMetadataIO"


def _is_metadata(location: str) -> bool:
    """Whether ``location`` is a table metadata file (``<n>-<uuid>[.gz].metadata.json``)."""
    return location.rstrip("/").endswith(".metadata.json")


class BoundedMetadataIO(PyArrowFileIO):
    """pyarrow's FileIO, with every table metadata file's size checked before it is read."""

    def __init__(self, properties: Properties = EMPTY_DICT) -> None:
        super().__init__(properties)
        self.max_metadata_bytes = int(properties.get(MAX_METADATA_PROPERTY, MAX_METADATA_BYTES))

    def new_input(self, location: str) -> PyArrowFile:
        """The file to read; a metadata file over the bound is refused before it is opened.

        Raises:
            ObjectTooLargeError: ``location`` is a metadata file larger than the bound.
        """
        file = super().new_input(location)
        if _is_metadata(location):
            size = len(file)
            if size > self.max_metadata_bytes:
                raise ObjectTooLargeError(
                    f"Iceberg table metadata {location} holds {size} bytes, more than the "
                    f"{self.max_metadata_bytes} this engine reads ({MAX_METADATA_PROPERTY}): it "
                    "was not read. Someone who can commit to the table made it that large (a "
                    "snapshot summary or a property of that size), or the table keeps too many "
                    "snapshots: expire them, or raise the bound if the table is meant to be so.",
                    path=location,
                    size=size,
                    limit=self.max_metadata_bytes,
                )
        return file
