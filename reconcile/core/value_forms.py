"""Value forms: the one spelling of a value that a column type accepts in several spellings.

Some column types take a value in several spellings and give back one. A
PostgreSQL ``uuid`` takes ``'ABCDEF01-…'``, ``'{abcdef01…}'`` and a
``uuid.UUID``, and reads back as lowercase hyphenated text; a ``jsonb`` sorts an
object's keys and rewrites its numbers; a ``char(4)`` pads ``'ab'`` to ``'ab  '``.
The row hash hashes values as they are (``reconcile.core.hashing``: one
definition), so the expected state must hold the spelling the sink gives back,
or every verify would report the row and every repair would write it again.

A column's *form* says which spelling that is. A sink names it in the Arrow
field metadata of its ``arrow_schema()`` (key ``value_form``, e.g. ``uuid``,
``jsonb``, ``bpchar(4)``); the expected-state store puts every value of such a
column into its form when it stages an epoch (``expected_state.changes``); the
sink writes that same form; and its pull reads the column as the server gives
it back, which is that form. So both sides hash one value. A form is applied
only where the store's column has the form's Arrow type (a ``uuid`` declared
``fixed_size_binary(16)`` in ``schemas=`` keeps its bytes).

=================  ===========================================================
form               the value the store holds
=================  ===========================================================
``uuid``           lowercase hyphenated text (``8-4-4-4-12``), from any text
                   that spells 32 hex digits (any case, hyphens anywhere,
                   ``{…}``, ``urn:uuid:``), a ``uuid.UUID`` or 16 bytes
``jsonb``          PostgreSQL's own output text of the jsonb value (below), from
                   JSON text (a document: ``'{"a": 1}'`` is an object, never a
                   JSON string) or a Python value (dict, list, number, bool)
``bpchar(n)``      text padded with blanks to ``n`` characters (blanks past
                   ``n`` dropped, as the server does; a longer value refused)
``bpchar``         text as given (``bpchar`` without a length pads nothing)
``rtrim(n)``       text without trailing blanks, at most ``n`` characters
                   (MariaDB ``CHAR(n)`` gives values back so)
``maxlen(n)``      text of at most ``n`` characters (longer refused: a server
                   would cut trailing blanks without a word)
``zeropad(n)``     bytes padded with NUL bytes to ``n`` (MariaDB ``BINARY(n)``)
``fraction(p)``    a timestamp with at most ``p`` fractional digits of a second
                   (a finer one is refused, never rounded)
``finite``         a float that is neither NaN nor infinite (MariaDB stores neither)
=================  ===========================================================

The ``jsonb`` text is defined in ``reconcile.core.json_text``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.json_text import FormError, canonical_json, json_form

__all__ = [
    "FORM_KEY",
    "REFUSED_KEY",
    "FormError",
    "ValueForm",
    "canonical_json",
    "form_of",
    "forms_of",
    "refused_columns",
    "with_form",
    "with_refused",
]

# Field metadata key of a sink's arrow_schema(): the column's form (its spec).
FORM_KEY = b"value_form"
# Schema metadata key of a sink's arrow_schema(): JSON {column: why it is refused},
# for the columns whose type the engine cannot hold exactly.
REFUSED_KEY = b"refused_columns"

_UUID_HEX = re.compile(r"[0-9a-f]{32}")
_SPEC = re.compile(r"([a-z]+)(?:\((\d+)\))?")
_SIZED = frozenset({"bpchar", "rtrim", "maxlen", "zeropad", "fraction"})
_NAMES = frozenset({"uuid", "jsonb", "finite", *_SIZED})


# ---------------------------------------------------------------------------
# uuid
# ---------------------------------------------------------------------------


def _uuid_hex(text: str) -> str:
    """32 lowercase hex digits from a uuid's text, by the same steps as ``_uuid_array``."""
    hexed = text.lower().replace("urn:", "").replace("uuid:", "").strip("{}").replace("-", "")
    if not _UUID_HEX.fullmatch(hexed):
        raise FormError("not a UUID (32 hex digits, hyphens and {} optional)", text)
    return hexed


def _hyphenated(hexed: str) -> str:
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"


def _uuid_value(value: Any) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, str):
        return _hyphenated(_uuid_hex(value))
    if isinstance(value, bytes | bytearray | memoryview) and len(bytes(value)) == 16:
        return str(uuid.UUID(bytes=bytes(value)))
    raise FormError("expected a uuid.UUID, a UUID's text or 16 bytes", value)


_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _uuid_bytes_text(arr: pa.Array) -> pa.Array:
    """16-byte values as lowercase hyphenated text (NULLs stay NULL)."""
    raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8)[arr.offset * 16 :]
    raw = raw[: len(arr) * 16].reshape(-1, 16)
    digits = np.empty((len(arr), 32), dtype=np.uint8)
    digits[:, 0::2] = _HEX_DIGITS[raw >> 4]
    digits[:, 1::2] = _HEX_DIGITS[raw & 0x0F]
    hyphen = np.full((len(arr), 1), ord("-"), dtype=np.uint8)
    cuts = [digits[:, :8], hyphen, digits[:, 8:12], hyphen, digits[:, 12:16], hyphen,
            digits[:, 16:20], hyphen, digits[:, 20:]]  # fmt: skip
    text = np.ascontiguousarray(np.hstack(cuts)).tobytes()
    offsets = np.arange(len(arr) + 1, dtype=np.int32) * 36
    out = pa.StringArray.from_buffers(len(arr), pa.py_buffer(offsets), pa.py_buffer(text))
    return pc.if_else(arr.is_valid(), out, pa.scalar(None, pa.string()))


def _uuid_array(arr: pa.Array) -> pa.Array:
    """Any text or 16-byte array of UUIDs as lowercase hyphenated text, vectorized."""
    if isinstance(arr.type, pa.ExtensionType):
        arr = arr.storage
    if pa.types.is_fixed_size_binary(arr.type) and arr.type.byte_width == 16:
        return _uuid_bytes_text(arr)
    text = pc.utf8_lower(arr.cast(pa.string()))
    for noise in ("urn:", "uuid:"):
        text = pc.replace_substring(text, noise, "")
    text = pc.replace_substring(pc.utf8_trim(text, "{}"), "-", "")
    bad = pc.invert(pc.fill_null(pc.match_substring_regex(text, "^[0-9a-f]{32}$"), True))
    if pc.any(bad).as_py():
        index = pc.index(bad, True).as_py()
        raise FormError("not a UUID (32 hex digits, hyphens and {} optional)",
                        arr[index].as_py(), index)  # fmt: skip
    pieces = [pc.utf8_slice_codeunits(text, a, b) for a, b in ((0, 8), (8, 12), (12, 16),
                                                              (16, 20), (20, 32))]  # fmt: skip
    return pc.binary_join_element_wise(*pieces, "-")


# ---------------------------------------------------------------------------
# The forms
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ValueForm:
    """A column's form (see the module's docstring).

    Attributes:
        name: ``uuid``, ``jsonb``, ``bpchar``, ``rtrim``, ``maxlen``,
            ``zeropad``, ``fraction`` or ``finite``.
        size: the length (``bpchar``, ``rtrim``, ``maxlen``, ``zeropad``) or the
            fractional digits (``fraction``); None where there is none.
    """

    name: str
    size: int | None = None

    def __post_init__(self) -> None:
        if self.name not in _NAMES or (self.size is not None and self.name not in _SIZED):
            raise ValueError(f"no value form {self.spec!r}")

    @property
    def spec(self) -> str:
        """How metadata and messages spell it: ``uuid``, ``bpchar(4)``."""
        return self.name if self.size is None else f"{self.name}({self.size})"

    @classmethod
    def parse(cls, spec: str) -> ValueForm:
        """The form a spec names.

        Raises:
            ValueError: no such form.
        """
        found = _SPEC.fullmatch(spec)
        if found is None:
            raise ValueError(f"no value form {spec!r}")
        return cls(found.group(1), None if found.group(2) is None else int(found.group(2)))

    def applies_to(self, dtype: pa.DataType) -> bool:
        """Whether a store column of Arrow type ``dtype`` holds values in this form."""
        t = pa.types
        if self.name == "zeropad":
            return bool(t.is_binary(dtype) or t.is_large_binary(dtype))
        if self.name == "fraction":
            return bool(t.is_timestamp(dtype))
        if self.name == "finite":
            return bool(t.is_floating(dtype))
        return bool(t.is_string(dtype) or t.is_large_string(dtype))

    def of_python(self, value: Any) -> Any:
        """A non-NULL Python value in this form (text, bytes, a datetime or a float).

        Raises:
            FormError: a value that has no spelling in the form, saying why.
        """
        name, size = self.name, self.size
        if name == "uuid":
            return _uuid_value(value)
        if name == "jsonb":
            return json_form(value)
        if name == "fraction":
            if isinstance(value, dt.datetime) and value.microsecond % 10 ** (6 - (size or 0)):
                raise FormError(f"more than {size} fractional digits of a second (the "
                                "column would round it)", value)  # fmt: skip
            return value
        if name == "finite":
            if isinstance(value, float) and not math.isfinite(value):
                raise FormError("the column cannot hold NaN or an infinity", value)
            return value
        if name == "zeropad":
            if not isinstance(value, bytes | bytearray | memoryview):
                raise FormError("expected bytes", value)
            raw = bytes(value)
            if size is not None and len(raw) > size:
                raise FormError(f"longer than {size} bytes", value)
            return raw.ljust(size or 0, b"\x00")
        if not isinstance(value, str):
            raise FormError("expected a str", value)
        return self._text(value)

    def _text(self, value: str) -> str:
        name, size = self.name, self.size
        if name == "maxlen":
            if size is not None and len(value) > size:
                raise FormError(f"longer than {size} characters", value)
            return value
        if name == "bpchar" and size is None:
            return value
        trimmed = value.rstrip(" ")
        if size is not None and len(trimmed) > size:
            raise FormError(f"longer than {size} characters", value)
        return trimmed if name == "rtrim" else trimmed.ljust(size or 0)

    def of_arrow(self, arr: pa.Array) -> pa.Array:
        """An Arrow array's values in this form (NULLs stay NULL).

        Text forms give a string array (from text; ``uuid`` also from 16-byte
        binaries; ``jsonb`` also from structs and lists); the others
        give the array back once checked.

        Raises:
            FormError: the first value that has no spelling in the form, with its index.
        """
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        if pa.types.is_null(arr.type):
            return arr
        if self.name == "uuid":
            return _uuid_array(arr)
        if self.name in ("bpchar", "rtrim", "maxlen") and (
            pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
        ):
            return self._text_array(arr)
        if self.name == "fraction" and pa.types.is_timestamp(arr.type):
            return self._fraction_array(arr)
        if self.name == "finite" and pa.types.is_floating(arr.type):
            bad = pc.fill_null(pc.invert(pc.is_finite(arr)), False)
            if pc.any(bad).as_py():
                index = pc.index(bad, True).as_py()
                raise FormError("the column cannot hold NaN or an infinity",
                                arr[index].as_py(), index)  # fmt: skip
            return arr
        if self.name in ("fraction", "finite"):
            return arr  # another type: the cast to the store's type decides
        out = []
        for index, value in enumerate(arr.to_pylist()):
            try:
                out.append(None if value is None else self.of_python(value))
            except FormError as err:
                raise FormError(err.reason, value, index) from None
        return pa.array(out, pa.binary() if self.name == "zeropad" else pa.string())

    def _text_array(self, arr: pa.Array) -> pa.Array:
        size = self.size
        if self.name == "bpchar" and size is None:
            return arr
        checked = arr if self.name == "maxlen" else pc.utf8_rtrim(arr, " ")
        if size is not None:
            bad = pc.fill_null(pc.greater(pc.utf8_length(checked), size), False)
            if pc.any(bad).as_py():
                index = pc.index(bad, True).as_py()
                raise FormError(f"longer than {size} characters", arr[index].as_py(), index)
        if self.name == "bpchar":
            return pc.utf8_rpad(checked, width=size, padding=" ")
        return checked

    def _fraction_array(self, arr: pa.Array) -> pa.Array:
        step = 10 ** (6 - (self.size or 0))
        try:
            micros = arr.cast(pa.timestamp("us", tz=arr.type.tz), safe=True).cast(pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return arr  # finer than microseconds: the cast to the store's type refuses it
        values = micros.fill_null(0).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(values % step)
        if len(bad):
            index = int(bad[0])
            raise FormError(f"more than {self.size} fractional digits of a second (the "
                            "column would round it)", arr[index].as_py(), index)  # fmt: skip
        return arr


def form_of(field: pa.Field) -> ValueForm | None:
    """The form a sink's field names in its metadata; None when it names none."""
    spec = (field.metadata or {}).get(FORM_KEY)
    return None if spec is None else ValueForm.parse(spec.decode())


def with_form(field: pa.Field, form: ValueForm | None) -> pa.Field:
    """``field`` naming ``form`` in its metadata (unchanged for None)."""
    if form is None:
        return field
    return field.with_metadata({**(field.metadata or {}), FORM_KEY: form.spec.encode()})


def forms_of(types: pa.Schema | None, store: pa.Schema | None = None) -> dict[str, ValueForm]:
    """Column -> form, for the columns of a sink's ``types`` whose form the store column takes.

    Args:
        types: a sink's ``arrow_schema()`` (None: no forms).
        store: the store's schema, whose types decide where a form applies
            (``ValueForm.applies_to``); a column it lacks takes the sink's type.
    """
    if types is None:
        return {}
    out = {}
    for field in types:
        form = form_of(field)
        if form is None:
            continue
        held = field.type
        if store is not None and store.get_field_index(field.name) >= 0:
            held = store.field(field.name).type
        if form.applies_to(held):
            out[field.name] = form
    return out


def refused_columns(types: pa.Schema | None) -> dict[str, str]:
    """Column -> why the engine cannot hold it, as a sink's ``arrow_schema()`` says."""
    raw = ((types.metadata or {}) if types is not None else {}).get(REFUSED_KEY)
    return {} if raw is None else dict(json.loads(raw))


def with_refused(schema: pa.Schema, refused: Mapping[str, str]) -> pa.Schema:
    """``schema`` saying which columns are refused and why (nothing added when none are)."""
    if not refused:
        return schema
    return schema.with_metadata(
        {**(schema.metadata or {}), REFUSED_KEY: json.dumps(dict(refused)).encode()}
    )
