"""The S3 files backend, as it declares itself to ``sinks.registry``.

Batch files on S3 object storage (AWS, MinIO, any S3 API): ``s3://bucket/prefix``.
It needs the ``s3`` extra (boto3); endpoint, region and credentials come from
the environment.
"""

from __future__ import annotations

from sinks.base import PULLABLE, Backend

__all__ = ["BACKEND"]

BACKEND = Backend(
    name="s3",
    schemes=("s3",),
    open="sinks.s3.sink:open_uri",
    extra="s3",
    requires=("boto3",),
    capabilities={PULLABLE: "sinks.s3.sink:pullable_sink"},
)
