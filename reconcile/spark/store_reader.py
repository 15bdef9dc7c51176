"""How the Spark verify job reads the expected state: delta-spark's reader, or the version's files.

``store_reader`` (``SparkRecoverOptions``) picks it: "delta-spark", "files" or
"auto" (delta-spark when the session carries its JARs). Spark's own reader
plans the read from the Delta log itself, as a user's ``format("delta")``
query of the store does; the files path reads the data files of the same
version, listed from the log by delta-rs on the driver, and holds the same rows.
"""

from __future__ import annotations

import logging
from typing import Any

from expected_state.spark_bridge import delta_jars_available
from expected_state.spark_state import read_state
from reconcile.core.contract import ConfigurationError, InvalidInputError
from reconcile.core.expected import ExpectedStore

__all__ = ["expected_side", "native_reader"]

log = logging.getLogger("reconcile.spark.verify")

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


_BY_FILES = "from the store version's data files"


def expected_side(
    spark: Any, store: ExpectedStore, keys: list[str], epoch: int, native: bool, reader: str
) -> tuple[Any, str]:
    """The store's state at ``epoch`` as a DataFrame, and how it was read (for the reason).

    delta-spark refuses some tables that delta-rs wrote and reads: a table-features
    protocol (one with a ``timestamp_ntz`` column) whose non-nullable columns
    delta-spark counts as the ``invariants`` feature, which delta-rs does not list.
    Under "auto" such a table is read from its version's data files, which hold the
    same rows, and the reason says why; asked for "delta-spark", the refusal stops
    the job, named.
    """
    version = store.version_of(epoch)
    if not native:
        return read_state(spark, store.uri, keys, version=version, native=False), _BY_FILES
    try:
        return read_state(spark, store.uri, keys, version=version, native=True), "by delta-spark"
    except Exception as exc:
        first = str(exc).strip().splitlines()
        refusal = next((line for line in first if "Delta" in line and "Exception" in line),
                       first[0] if first else type(exc).__name__)  # fmt: skip
        if "DeltaTableFeatureException" not in str(exc) and "DELTA_" not in str(exc):
            raise
        if reader != "auto":
            raise ConfigurationError(
                f"store table {store.uri!r}: delta-spark refuses to read it ({refusal.strip()}); "
                "use store_reader 'files' or 'auto'; nothing was pulled",
                table=store.uri,
            ) from None
        log.warning("store table %s: delta-spark refuses it (%s); reading its files",
                    store.uri, refusal.strip())  # fmt: skip
        return (
            read_state(spark, store.uri, keys, version=version, native=False),
            f"{_BY_FILES} (delta-spark refused the table: {refusal.strip()[:200]})",
        )
