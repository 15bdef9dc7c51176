"""Spark's S3A is pointed where the engine's own S3 client points, from the same variables.

The end-to-end proof is the interop test on moto
(``test_delta_spark_interop.py::test_spark_reads_a_store_on_s3_as_the_engine_does``);
these are the boundaries of the mapping: no endpoint, plain HTTP or TLS, the S3-only
endpoint variable first, and no key ever copied into a setting.
"""

from __future__ import annotations

from reconcile.spark.jars import s3a_settings

S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"


def test_s3a_reads_where_the_engines_s3_client_reads() -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1",
           "AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"}  # fmt: skip
    assert s3a_settings(env) == {
        "fs.s3.impl": S3A,  # the store's own s3:// URI
        "fs.s3a.endpoint": "http://127.0.0.1:9000",
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.endpoint.region": "eu-west-1",
    }
    assert not any("secret" in v or v == "id" for v in s3a_settings(env).values())


def test_aws_itself_needs_only_the_scheme_and_the_region() -> None:
    assert s3a_settings({}) == {"fs.s3.impl": S3A}
    assert s3a_settings({"AWS_DEFAULT_REGION": "us-east-2"})["fs.s3a.endpoint.region"] == (
        "us-east-2"
    )


def test_the_s3_endpoint_variable_wins_and_tls_is_kept() -> None:
    env = {"AWS_ENDPOINT_URL": "http://other:1", "AWS_ENDPOINT_URL_S3": "https://minio:9000"}
    got = s3a_settings(env)
    assert got["fs.s3a.endpoint"] == "https://minio:9000"
    assert got["fs.s3a.connection.ssl.enabled"] == "true"
