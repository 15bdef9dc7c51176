"""How a row becomes a Kafka record and back: a keyed record per row, a tombstone per delete.

A sink's topic is a table: the record key is the row's key columns, the value
the whole row, and a delete is a tombstone (a record whose value is null), so a
compacted topic holds the last value of every key. Both are JSON, written one
way only (keys sorted, no spaces), so the same row always gives the same bytes
and a key compares equal however it was built. Values JSON cannot hold as they
are get a tagged form that reads back to the same Python value: a
``decimal.Decimal`` is ``{"$decimal": "12.30"}``, a datetime, date or time
``{"$datetime": ISO 8601}`` (``$date``, ``$time``), bytes ``{"$bytes": base64}``,
a float that is not finite ``{"$float": "nan"}``. A value of any other type is
refused, naming the column.

Every record of the engine carries headers: ``reconcile.txn`` (the sink txn
id that wrote it) and ``reconcile.epoch``. A record without them was written by
another producer; pull-and-diff counts it as such.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from reconcile.core.contract import InvalidInputError

__all__ = [
    "EPOCH_HEADER",
    "TXN_HEADER",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_value",
    "header",
]

TXN_HEADER = "reconcile.txn"
EPOCH_HEADER = "reconcile.epoch"


def _tagged(value: Any, column: str, topic: str) -> Any:
    """``value`` as JSON can hold it (see the module's docstring)."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise InvalidInputError(
                f"kafka topic {topic!r}: column {column!r} holds {value}, a decimal that is "
                "not finite; nothing was written",
                topic=topic,
                column=column,
            )
        return {"$decimal": str(value)}
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, dt.time):
        return {"$time": value.isoformat()}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    raise InvalidInputError(
        f"kafka topic {topic!r}: column {column!r} holds a {type(value).__name__} "
        f"({value!r:.80}), which the Kafka sink cannot write as JSON; nothing was written",
        topic=topic,
        column=column,
    )


def _untagged(value: Any) -> Any:
    if isinstance(value, dict) and len(value) == 1:
        ((tag, text),) = value.items()
        if tag == "$decimal":
            return decimal.Decimal(text)
        if tag == "$datetime":
            return dt.datetime.fromisoformat(text)
        if tag == "$date":
            return dt.date.fromisoformat(text)
        if tag == "$time":
            return dt.time.fromisoformat(text)
        if tag == "$bytes":
            return base64.b64decode(text)
        if tag == "$float":
            return float(text)
    return value


def _dumps(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def encode_key(row: Mapping[str, Any], keys: Sequence[str], topic: str) -> bytes:
    """The record key of ``row``: its key columns, in order, as a JSON array.

    Raises:
        InvalidInputError: a key column is missing or NULL, or its value cannot be
            written, naming the topic and the column.
    """
    values = []
    for key in keys:
        if row.get(key) is None:
            raise InvalidInputError(
                f"kafka topic {topic!r}: a row has no value for key column {key!r} "
                f"({dict(row)!r:.120}); nothing was written",
                topic=topic,
                column=key,
            )
        values.append(_tagged(row[key], key, topic))
    return _dumps(values)


def encode_value(row: Mapping[str, Any], topic: str) -> bytes:
    """The record value of ``row``: the whole row as a JSON object.

    Raises:
        InvalidInputError: a value cannot be written, naming the topic and the column.
    """
    return _dumps({str(k): _tagged(v, str(k), topic) for k, v in row.items()})


def decode_key(data: bytes, keys: Sequence[str]) -> dict[str, Any]:
    """A record key back to ``{column: value}``; a key of another shape raises ValueError."""
    values = json.loads(data)
    if not isinstance(values, list) or len(values) != len(keys):
        raise ValueError(f"not a key of {list(keys)}: {data[:80]!r}")
    return {k: _untagged(v) for k, v in zip(keys, values, strict=True)}


def decode_value(data: bytes) -> dict[str, Any]:
    """A record value back to a row; a value that is not a JSON object raises ValueError."""
    row = json.loads(data)
    if not isinstance(row, dict):
        raise ValueError(f"not a row (a JSON object): {data[:80]!r}")
    return {str(k): _untagged(v) for k, v in row.items()}


def header(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> str | None:
    """The value of header ``name`` as text, or None when the record has none."""
    for key, value in headers or ():
        if key == name and value is not None:
            return value.decode()
    return None
