"""The engine on Spark: the exactly-once Structured Streaming writer.

Nothing here is imported by the core: a user who never touches Spark never starts a JVM.
"""

from reconcile.core.extras import require

# Everything here runs on Spark: without the extra, say so at once.
require("pyspark", extra="spark", what="reconcile.spark")

from reconcile.spark.stream import StreamWriter, write_stream  # noqa: E402

__all__ = ["StreamWriter", "write_stream"]
