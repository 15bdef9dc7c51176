"""How the Spark verify job reads the expected state: delta-spark's reader, or the version's files.

``store_reader`` (``SparkRecoverOptions``) picks it: "delta-spark", "files" or
"auto" (delta-spark when the session carries its JARs). Spark's own reader
plans the read from the Delta log itself, as a user's ``format("delta")``
query of the store does; the files path reads the data files of the same
version, listed from the log by delta-rs on the driver, and holds the same rows.
"""

from __future__ import annotations

from typing import Any

from expected_state.spark_bridge import delta_jars_available
from expected_state.spark_state import read_state
from reconcile.core.contract import ConfigurationError, InvalidInputError
from reconcile.core.expected import ExpectedStore

__all__ = ["expected_side", "native_reader"]

_READERS = ("auto", "delta-spark", "files")


def native_reader(spark: Any, reader: str) -> bool:
    """Whether the expected state is read by delta-spark (``store_reader``, see the options).

    Raises:
        InvalidInputError: a reader that is none of ``_READERS``.
        ConfigurationError: "delta-spark" asked of a session without its JARs.
    """
    if reader not in _READERS:
        raise InvalidInputError(
            f"store_reader {reader!r}: expected one of {', '.join(_READERS)}; nothing was pulled"
        )
    available = delta_jars_available(spark)
    if reader == "delta-spark" and not available:
        raise ConfigurationError(
            "store_reader 'delta-spark': this Spark session does not carry delta-spark's JARs "
            "(scripts/setup caches them; reconcile.spark.session.local_session puts them on "
            "the session); use store_reader 'files' or 'auto'; nothing was pulled"
        )
    # "auto" prefers Spark's own reader: it plans the read from the log itself
    # (statistics, no file list through the driver), and is what a user's own
    # ``format("delta")`` query of the store reads.
    return reader == "delta-spark" or (reader == "auto" and available)


def expected_side(
    spark: Any, store: ExpectedStore, keys: list[str], epoch: int, native: bool
) -> tuple[Any, str]:
    """The store's state at ``epoch`` as a DataFrame, and how it was read (for the reason).

    ``native`` is :func:`native_reader`'s answer. Every store table the engine
    writes is one delta-spark reads (expected_state.protocol), so a refusal by
    it is an error to see, not a reason to read the files instead.
    """
    version = store.version_of(epoch)
    frame = read_state(spark, store.uri, keys, version=version, native=native)
    return frame, "by delta-spark" if native else "from the store version's data files"
