"""The S3 calls of the file sink on object storage: one bucket and prefix, through boto3.

Why boto3 and not pyarrow's S3FileSystem, fsspec/s3fs or obstore: the commit
log needs PutObject's conditional headers (``If-None-Match: *``, ``If-Match``),
which pyarrow's filesystem does not expose; boto3 is AWS's own SDK, kept in step
with the S3 API, and reads every standard source of configuration and
credentials (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``, profiles, SSO, instance roles), so AWS, MinIO and
other S3 servers work unchanged and no credential ever passes through our
code or a URI. (The expected-state store reaches S3 through deltalake and
pyarrow instead: delta-rs makes its own conditional puts.)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from reconcile.core.contract import ConfigurationError, ObjectTooLargeError, RetryableError
from sinks.base import redact_uri

__all__ = ["Bucket", "PreconditionFailed", "S3Location", "parse_s3_uri"]

# The status codes of a lost conditional put: 412 (the object exists, or its
# ETag changed) and 409 (AWS: a concurrent conditional put of the same key is
# in flight). Both mean "someone else wrote first": re-read, never overwrite.
_LOST_RACE = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}


class PreconditionFailed(Exception):
    """A conditional put lost: the key exists (If-None-Match) or changed (If-Match)."""


class _EmptyObject(Exception):
    """A ranged GET of an object that holds no byte (S3 answers 416, InvalidRange)."""


@dataclass(frozen=True)
class S3Location:
    """``s3://bucket/prefix``: where one sink root lives. Holds no credential."""

    bucket: str
    prefix: str

    def uri(self) -> str:
        """The location as a URI (safe to show)."""
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def child(self, name: str) -> S3Location:
        """The location of ``name`` under this one."""
        return S3Location(self.bucket, f"{self.prefix}/{name}".strip("/"))


def parse_s3_uri(name: str, uri: str) -> S3Location:
    """The bucket and prefix of ``s3://bucket/prefix``.

    Raises:
        ConfigurationError: not an s3 URI, no bucket, credentials or options in it
            (credentials come from the environment, never from a URI).
    """
    shown = redact_uri(uri)
    try:
        parts = urlsplit(uri)
    except ValueError as exc:
        raise ConfigurationError(f"sink {name!r}: {shown!r} is not a URI ({exc})") from exc
    if parts.scheme != "s3" or not parts.hostname:
        raise ConfigurationError(f"sink {name!r}: {shown!r} is not s3://bucket/prefix")
    if "@" in parts.netloc or parts.query or parts.fragment:
        raise ConfigurationError(
            f"sink {name!r}: {shown!r} must be s3://bucket/prefix alone: credentials and "
            "options come from the environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...)"
        )
    return S3Location(parts.netloc, parts.path.strip("/"))


@dataclass
class Bucket:
    """One location's objects: put (conditionally), get, list and delete by relative key.

    The boto3 client is made on first use and dropped when pickled: a copy
    that another process unpickles makes its own.
    """

    location: S3Location
    _client: Any = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.location = state["location"]
        self._client = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = _shared_client()
            return self._client

    def key(self, relative: str) -> str:
        """The object key of ``relative`` under the location."""
        return f"{self.location.prefix}/{relative}".lstrip("/")

    def uri(self, relative: str) -> str:
        """``s3://bucket/key`` of ``relative`` (for messages)."""
        return f"s3://{self.location.bucket}/{self.key(relative)}"

    def put(self, relative: str, body: bytes, *, if_none_match: bool = False) -> str:
        """Write an object whole (a PUT is atomic: all of it or none); its ETag.

        Args:
            relative: the key under the location.
            body: the bytes.
            if_none_match: only if no object has that key (``If-None-Match: *``).

        Raises:
            PreconditionFailed: ``if_none_match`` and the key exists.
            RetryableError: S3 could not be reached or refused for a transient reason.
        """
        kwargs: dict[str, Any] = {"IfNoneMatch": "*"} if if_none_match else {}
        reply = self._call("put", relative, "put_object", Body=body, **kwargs)
        return str(reply.get("ETag", ""))

    def get(self, relative: str, *, first_bytes: int | None = None) -> bytes | None:
        """The object's bytes (the first ``first_bytes`` only, if given); None if absent."""
        kwargs: dict[str, Any] = {}
        if first_bytes is not None:
            kwargs["Range"] = f"bytes=0-{first_bytes - 1}"
        try:
            reply = self._call("get", relative, "get_object", **kwargs)
        except FileNotFoundError:
            return None
        except _EmptyObject:
            return b""
        return bytes(reply["Body"].read())

    def get_bounded(self, relative: str, limit: int) -> bytes | None:
        """The object's bytes, if it holds at most ``limit`` of them; None if absent.

        At most ``limit + 1`` bytes are asked for (a ranged GET) and read,
        whatever the object's size: an object someone else put there cannot
        make the reader hold more.

        Raises:
            ObjectTooLargeError: the object holds more than ``limit`` bytes,
                naming it and its size; nothing of it is used.
            RetryableError: S3 could not be reached.
        """
        try:
            reply = self._call("get", relative, "get_object", Range=f"bytes=0-{limit}")
        except FileNotFoundError:
            return None
        except _EmptyObject:
            return b""
        stream = reply["Body"]
        try:
            body = bytes(stream.read(limit + 1))
        finally:
            stream.close()
        size = _total_size(reply.get("ContentRange"), len(body))
        if len(body) > limit or size > limit:
            where = self.uri(relative)
            raise ObjectTooLargeError(
                f"{where} holds {size} bytes, more than the {limit} this sink ever writes "
                "there: it was not read. Someone who can write the bucket put it there; "
                "remove or restore it, then run again.",
                path=where,
                size=size,
                limit=limit,
            )
        return body

    def delete(self, relative: str) -> None:
        """Remove the object (no error if it is absent: S3's DELETE is idempotent)."""
        self._call("delete", relative, "delete_object")

    def list(self, relative_prefix: str, *, start_after: str | None = None) -> Iterator[str]:
        """The relative keys under ``relative_prefix``, in key order, after ``start_after``."""
        kwargs: dict[str, Any] = {
            "Bucket": self.location.bucket,
            "Prefix": self.key(relative_prefix),
        }
        if start_after is not None:
            kwargs["StartAfter"] = self.key(start_after)
        strip = len(self.key(""))
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(**kwargs):
                for item in page.get("Contents", ()):
                    yield str(item["Key"])[strip:]
        except Exception as exc:
            raise self._error("list", relative_prefix, exc) from exc

    def _call(self, what: str, relative: str, method: str, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, method)(
                Bucket=self.location.bucket, Key=self.key(relative), **kwargs
            )
        except Exception as exc:
            code = _error_code(exc)
            if code in _LOST_RACE:
                raise PreconditionFailed(self.uri(relative)) from exc
            if code in ("NoSuchKey", "404"):
                raise FileNotFoundError(self.uri(relative)) from exc
            if code == "InvalidRange" and "Range" in kwargs:
                raise _EmptyObject(self.uri(relative)) from exc
            raise self._error(what, relative, exc) from exc

    def _error(self, what: str, relative: str, exc: Exception) -> Exception:
        code = _error_code(exc)
        if code in ("AccessDenied", "NoSuchBucket", "InvalidAccessKeyId", "403"):
            # A definite refusal: retrying cannot cure a missing bucket or a
            # missing permission, so it stops the pipeline with its name.
            return ConfigurationError(
                f"S3 refused to {what} {self.uri(relative)}: {code} ({exc}); check the bucket "
                "and the credentials in the environment"
            )
        return RetryableError(f"S3 {what} of {self.uri(relative)} failed: {exc}")


# One client per process and configuration: making a boto3 client loads the S3
# service model (a tenth of a second or more), and a restarted pipeline builds
# new sinks often. boto3 clients are thread-safe. The key is what the
# environment says about the endpoint and the identity (the secret itself is
# not kept here), so a changed environment gets a client of its own.
_CLIENTS: dict[tuple[str | None, ...], Any] = {}
_CLIENTS_LOCK = threading.Lock()
_CONFIG_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
                "AWS_PROFILE", "AWS_ACCESS_KEY_ID")  # fmt: skip


def _shared_client() -> Any:
    key = tuple(os.environ.get(name) for name in _CONFIG_VARS)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            import boto3
            from botocore.config import Config

            # Standard retries: throttling and 5xx are retried inside the
            # call, with backoff, before an error reaches the sink.
            config = Config(retries={"mode": "standard", "max_attempts": 5})
            client = _CLIENTS[key] = boto3.session.Session().client("s3", config=config)
        return client


def _error_code(exc: Exception) -> str:
    """The S3 error code of a botocore ClientError ('' for any other failure)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    code = response.get("Error", {}).get("Code")
    if code:
        return str(code)
    return str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


def _total_size(content_range: object, read: int) -> int:
    """The object's size from a ranged GET's ``Content-Range: bytes 0-N/TOTAL`` (else ``read``)."""
    total = str(content_range or "").rpartition("/")[2]
    return int(total) if total.isdigit() else read
