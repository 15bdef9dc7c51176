"""The engine on Spark: the exactly-once Structured Streaming writer.

Nothing here is imported by the core: a user who never touches Spark never starts a JVM.
"""

from reconcile.spark.stream import StreamWriter, write_stream

__all__ = ["StreamWriter", "write_stream"]
