"""The JARs Spark takes from the venv's cache: Kafka's connector, Delta's, the real-time writer.

``scripts/fetch-jars`` fetches each group once from Maven Central into
``<venv>/jars/<group>/``; a session started by the engine (``local_session``)
lists the Spark groups that are there in ``spark.jars``. The real-time writer's group
is built (not fetched) by the same script from ``jvm/realtime-writer``. Nothing is downloaded
at run time: a group that is missing is named, with the script that fetches it,
by whoever needs it (:func:`require`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from reconcile.core.contract import ConfigurationError

__all__ = [
    "DELTA_CONF",
    "DELTA_GROUP",
    "REALTIME_GROUP",
    "S3_GROUP",
    "SPARK_GROUPS",
    "group_folder",
    "require",
    "s3a_settings",
    "spark_jars",
]

# The group of Delta Lake's own Spark reader and writer (scripts/jars/delta-spark.xml).
DELTA_GROUP = "delta-spark"
# Hadoop's S3A file system and the AWS SDK modules it loads (scripts/jars/spark-s3.xml).
S3_GROUP = "spark-s3"
# Real-Time Mode's JVM writer and the PostgreSQL JDBC driver (jvm/realtime-writer).
REALTIME_GROUP = "realtime-writer"
# The cached groups that go on Spark's classpath (the Kafka broker's does not).
SPARK_GROUPS = ("spark-kafka", DELTA_GROUP, S3_GROUP, REALTIME_GROUP)
# What a session needs besides the JARs for Delta's SQL (DESCRIBE DETAIL delta.`<path>`,
# time travel in SQL) and its catalog; set only when the JARs are there, since Spark
# fails to start on an extension class it cannot load.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # A store table's log is small: Delta's default of 50 partitions to replay it makes
    # each read of a version 50 tasks of nothing on a local session.
    "spark.databricks.delta.snapshotPartitions": "2",
    # delta-spark refuses time travel to a version older than the table's
    # deletedFileRetentionDuration, which the store sets to minutes to keep its
    # tombstones few (expected_state/layout.py); the store's own vacuum keeps the
    # files of every version recovery reads, by epoch and not by age, so the
    # versions delta-rs reads must be read here too.
    "spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration": "false",
}


def group_folder(group: str) -> Path:
    """Where ``group``'s JARs are cached in this venv."""
    return Path(sys.prefix) / "jars" / group


def spark_jars() -> list[str]:
    """Every cached JAR of the Spark groups, for ``spark.jars`` (missing groups left out)."""
    return sorted(str(p) for g in SPARK_GROUPS for p in group_folder(g).glob("*.jar"))


def require(group: str, what: str) -> Path:
    """The folder of ``group``'s JARs.

    Raises:
        ConfigurationError: they are not cached, naming ``what`` needs them and how to fetch.
    """
    folder = group_folder(group)
    if not any(folder.glob("*.jar")):
        raise ConfigurationError(
            f"{what} needs the {group} JARs, which are not in {folder}: run scripts/setup "
            "(or scripts/fetch-jars), which fetches them once from Maven Central"
        )
    return folder


def s3a_settings(env: Mapping[str, str]) -> dict[str, str]:
    """Hadoop settings that point S3A where the engine's own S3 client points, from ``env``.

    The store and the S3 sinks are configured by the standard AWS variables (delta-rs and
    boto3 read them); Spark must read the same bucket at the same endpoint. ``s3://`` is
    mapped to S3A too, so the store's own URI (``s3://bucket/root``) is read as it is
    written. Keys are not copied into settings (Spark shows its settings): S3A's default
    credential chain reads ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` itself.
    """
    out = {"fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        # An endpoint of its own is MinIO, moto or the like: buckets in the path.
        out["fs.s3a.endpoint"] = endpoint
        out["fs.s3a.path.style.access"] = "true"
        out["fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https:")).lower()
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        out["fs.s3a.endpoint.region"] = region
    return out
