"""The ``jsonb`` text of a JSON value: the one spelling PostgreSQL gives back for it.

The ``jsonb`` text: an object's keys sorted by their UTF-8 length, then by their
bytes (a key given twice keeps its last value); ``", "`` between members and
elements, ``": "`` after a key; strings escaped as ``json.dumps(...,
ensure_ascii=False)`` escapes them (``"``, ``\\``, and control characters only);
numbers as PostgreSQL's ``numeric`` prints them: no exponent, the scale kept
(``1.50`` stays ``1.50``, ``1e2`` is ``100``, ``-0.0`` is ``0.0``); a float as the
shortest decimal that reads back as it (``repr``). NaN and infinities, ``\\u0000``
and unpaired surrogates are refused (jsonb holds none of them).
``tests/integration/test_column_types.py`` checks that PostgreSQL gives back
exactly this text for what the engine writes.

``json_form`` is the ``jsonb`` value form of ``reconcile.core.value_forms``
(PostgreSQL's json columns take it too: they are compared by meaning).
"""

from __future__ import annotations

import decimal
import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["FormError", "canonical_json", "json_form"]

# PostgreSQL's numeric holds up to 131072 digits before the point, 16383 after.
_NUMERIC_INT_DIGITS = 131072
_NUMERIC_SCALE = 16383


class FormError(ValueError):
    """A value that has no spelling in its column's form; the message says why.

    Attributes:
        value: the value as given.
        index: its position in an array (None for one value).
    """

    def __init__(self, reason: str, value: Any, index: int | None = None) -> None:
        super().__init__(reason)
        self.reason, self.value, self.index = reason, value, index


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_float=decimal.Decimal, parse_constant=_refuse_constant)


def _parse_json(text: str) -> Any:
    """The value of JSON text (numbers with a point or exponent as exact Decimals)."""
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError) as err:
        raise FormError(f"not JSON text ({err})", text) from None


def _number(value: decimal.Decimal) -> str:
    if not value.is_finite():
        raise FormError("NaN and infinities are not JSON numbers", value)
    _sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite
    if len(digits) + exponent > _NUMERIC_INT_DIGITS or -exponent > _NUMERIC_SCALE:
        raise FormError("a JSON number beyond what PostgreSQL's numeric holds", value)
    text = format(value, "f")
    # numeric has no negative zero: -0.0 prints as 0.0.
    return text[1:] if text.startswith("-") and not any(digits) else text


def _string(text: str, *, jsonb: bool) -> str:
    if jsonb and "\x00" in text:
        raise FormError("jsonb cannot hold the character \\u0000", text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise FormError("an unpaired surrogate is no character", text) from None
    return json.dumps(text, ensure_ascii=False)


def _key_order(item: tuple[str, Any]) -> tuple[int, bytes]:
    raw = item[0].encode("utf-8", "surrogatepass")
    return len(raw), raw


def _canonical(value: Any, jsonb: bool, depth: int) -> str:
    if depth > 1000:
        raise FormError("JSON nested more than 1000 deep", value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _string(value, jsonb=jsonb)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FormError("NaN and infinities are not JSON numbers", value)
        return _number(decimal.Decimal(repr(value)))
    if isinstance(value, decimal.Decimal):
        return _number(value)
    if isinstance(value, Mapping):
        members = []
        for key in value:
            if not isinstance(key, str):
                raise FormError(f"a JSON object's keys are strings, not {type(key).__name__}",
                                value)  # fmt: skip
        for key, item in sorted(value.items(), key=_key_order):
            members.append(f"{_string(key, jsonb=jsonb)}: {_canonical(item, jsonb, depth + 1)}")
        return "{" + ", ".join(members) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_canonical(item, jsonb, depth + 1) for item in value) + "]"
    raise FormError(f"a {type(value).__name__} is no JSON value", value)


def canonical_json(value: Any) -> str:
    """The ``jsonb`` text of a Python JSON value (see the module's docstring).

    Raises:
        FormError: a value JSON cannot hold (NaN, a non-string key, an object
            of another type), or jsonb cannot (``\\u0000``).
    """
    return _canonical(value, True, 0)


def json_form(value: Any) -> str:
    """A value of a ``json`` or ``jsonb`` column as its ``jsonb`` text.

    A str is JSON text, parsed (``'{"a": 1}'`` is an object, never a JSON
    string); any other value is a Python JSON value.

    Raises:
        FormError: not JSON, or not JSON the column can hold.
    """
    if isinstance(value, str):
        return _canonical(_parse_json(value), True, 0)
    return _canonical(value, True, 0)
