"""One rule for decimal values, shared by the sinks and the expected-state store.

A value goes into a ``numeric(p, s)`` / ``decimal(p, s)`` column only if it
fits *exactly*: no digit after the ``s``-th decimal place may be lost, and the
integer part must fit in ``p - s`` digits. Nothing is rounded. PostgreSQL would
round ``Decimal('1.005')`` into ``numeric(12,2)`` to ``1.01`` without a word,
while Arrow refuses the same cast; if a sink and the expected state disagreed
like that, an epoch could commit to one and be refused by the other. Both call
the functions here, before anything is written, so they accept and refuse the
same values.

Values:

- ``int`` (not ``bool``) and ``decimal.Decimal`` are taken as they are;
- a ``float`` stands for the shortest decimal that reads back as the same
  float (``repr(0.1) == '0.1'``), which is also what PostgreSQL and Arrow print
  for it. So ``1.1`` fits ``numeric(12,2)`` and ``1.005`` does not;
- NaN and infinities are refused for every column: a decimal type cannot hold
  them (Arrow's decimals have no NaN; ``numeric(p,s)`` has no infinity).

Trailing zeros do not count: ``Decimal('1.500')`` fits ``numeric(12,2)``.
Precision ``None`` means an unconstrained ``numeric``: any finite value fits.

The functions are pure (no I/O); ``check_decimal_array`` is the vectorized
form for Arrow data and accepts exactly what ``check_decimal`` accepts.
"""

from __future__ import annotations

import decimal
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]

__all__ = [
    "DecimalFitError",
    "arrow_decimal_type",
    "check_decimal",
    "check_decimal_array",
    "decimal_type_name",
]

# Arrow's widest decimal type holds 76 digits.
_ARROW_MAX_PRECISION = 76


def decimal_type_name(precision: int | None, scale: int | None) -> str:
    """The declared type as a user reads it: ``numeric(12,2)``, or ``numeric``."""
    if precision is None:
        return "numeric"
    return f"numeric({precision},{scale or 0})"


class DecimalFitError(ValueError):
    """A value does not fit a decimal type exactly; the message says why.

    Attributes:
        value: the offending value (as given).
        precision, scale: the declared type (precision None: unconstrained).
        reason: why it does not fit, in words.
        index: its position in the array, for ``check_decimal_array``.
    """

    def __init__(
        self,
        reason: str,
        value: Any,
        precision: int | None,
        scale: int | None,
        index: int | None = None,
    ) -> None:
        self.reason, self.value = reason, value
        self.precision, self.scale, self.index = precision, scale, index
        where = f" (row {index})" if index is not None else ""
        super().__init__(
            f"{value!r}{where} does not fit {decimal_type_name(precision, scale)} exactly: "
            f"{reason}; it is refused rather than rounded"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Picklable (Spark executors send errors back to the driver).
        args = (self.reason, self.value, self.precision, self.scale, self.index)
        return (type(self), args)


def _as_decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | decimal.Decimal):
        raise TypeError(f"expected an int, float or Decimal, got {type(value).__name__}")
    if isinstance(value, float):
        # repr() is the shortest string that reads back as the same float.
        return decimal.Decimal(repr(value))
    return decimal.Decimal(value)


def check_decimal(value: Any, precision: int | None, scale: int | None) -> decimal.Decimal:
    """The value as a Decimal, if it fits ``numeric(precision, scale)`` exactly.

    Args:
        value: an int, float or Decimal.
        precision: total significant digits; None for an unconstrained numeric.
        scale: digits after the decimal point (may be negative or exceed the
            precision, as PostgreSQL 15 allows); ignored when precision is None.

    Returns:
        The exact value (a float becomes the Decimal of its shortest repr).

    Raises:
        DecimalFitError: it is not finite, has digits beyond the scale, or its
            integer part needs more than ``precision - scale`` digits.
        TypeError: it is not an int, float or Decimal.
    """
    exact = _as_decimal(value)
    if not exact.is_finite():
        raise DecimalFitError("not a finite number", value, precision, scale)
    if precision is None:
        return exact
    scale = scale or 0
    _, digits, exponent = exact.as_tuple()
    assert isinstance(exponent, int)  # finite, checked above
    # Trailing zeros carry no information: 1.500 is 1.5.
    count = len(digits)
    while count and digits[count - 1] == 0:
        count -= 1
        exponent += 1
    if count == 0:
        return exact  # zero fits every type
    if exponent < -scale:
        raise DecimalFitError(
            f"it has {-exponent} digit(s) after the decimal point and the type keeps {scale}",
            value,
            precision,
            scale,
        )
    if count + exponent > precision - scale:
        raise DecimalFitError(
            f"its absolute value must be below 1E{precision - scale} (numeric field overflow)",
            value,
            precision,
            scale,
        )
    return exact


def arrow_decimal_type(precision: int, scale: int) -> pa.DataType | None:
    """The Arrow decimal type for ``numeric(precision, scale)``, or None if Arrow has none."""
    if not 0 <= scale <= precision or precision > _ARROW_MAX_PRECISION or precision < 1:
        return None
    return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)


def _first_misfit(
    array: pa.Array | pa.ChunkedArray, precision: int | None, scale: int | None
) -> None:
    """Raise DecimalFitError for the first value of ``array`` that does not fit."""
    for index, value in enumerate(array.to_pylist()):
        if value is None:
            continue
        try:
            check_decimal(value, precision, scale)
        except DecimalFitError as err:
            raise DecimalFitError(err.reason, value, precision, scale, index) from None


def _within_bounds(array: pa.Array | pa.ChunkedArray, target: pa.DataType) -> bool:
    """True if no integer or float value is out of ``target``'s range or below its unit.

    Arrow's casts miss some of these: a string-to-decimal cast reads
    '2.2250738585e-313' as 0, and an integer part too wide for 128 bits can
    wrap around instead of failing. So the range is checked here, in the
    source's own domain, before the cast. For floats the comparison with
    ``float(10**k)`` is exact in effect: a float's shortest repr is below
    ``10**k`` exactly when the float is below ``float(10**k)``.
    """
    limit = 10 ** (target.precision - target.scale)
    if pa.types.is_integer(array.type):
        if limit > 2**64:
            return True
        bound = pa.scalar(limit, pa.decimal256(_ARROW_MAX_PRECISION, 0))
        wide = array.cast(pa.decimal256(_ARROW_MAX_PRECISION, 0))
        inside = pc.and_(pc.less(wide, bound), pc.greater(wide, pc.negate(bound)))
    else:
        magnitude = pc.abs(array)
        inside = pc.and_(
            pc.less(magnitude, float(limit)),
            pc.or_(
                pc.equal(magnitude, 0.0),
                pc.greater_equal(magnitude, 10.0**-target.scale),
            ),
        )
    return bool(pc.all(inside).as_py())


def check_decimal_array(
    array: pa.Array | pa.ChunkedArray, precision: int | None, scale: int | None
) -> pa.Array | pa.ChunkedArray:
    """Check every value of an Arrow array as :func:`check_decimal` does, vectorized.

    Args:
        array: integers, floats, decimals or nulls (dictionary-encoded or not).
        precision, scale: the declared type (precision None: unconstrained).

    Returns:
        The array as Arrow's decimal type of ``(precision, scale)`` where Arrow
        has one (precision 1..76, 0 <= scale <= precision), so that it is
        written exactly; else the array itself, every value checked.

    Raises:
        DecimalFitError: naming the first value that does not fit and its row.
        TypeError: for an array of another type.
    """
    if pa.types.is_dictionary(array.type):
        array = array.cast(array.type.value_type)
    typ = array.type
    if not (
        pa.types.is_integer(typ)
        or pa.types.is_floating(typ)
        or pa.types.is_decimal(typ)
        or pa.types.is_null(typ)
    ):
        raise TypeError(f"expected integers, floats or decimals, got Arrow {typ}")
    if pa.types.is_floating(typ):
        # float16/float32 go through float64, which is what to_pylist() and
        # so check_decimal() see.
        array = array.cast(pa.float64())
        finite = pc.is_finite(array)
        if not pc.all(pc.or_kleene(finite, pc.is_null(array))).as_py():
            _first_misfit(array, precision, scale)
    target = None if precision is None else arrow_decimal_type(precision, scale or 0)
    if target is not None and not pa.types.is_decimal(typ) and not _within_bounds(array, target):
        _first_misfit(array, precision, scale)
    if target is None:
        if precision is not None:
            _first_misfit(array, precision, scale)  # no Arrow type for it: check by value
        return array
    try:
        if pa.types.is_floating(typ):
            # Arrow prints a float as its shortest round-trip string, like repr();
            # a string cast to decimal refuses any digit that would be lost (a
            # float cast to decimal would round).
            staged = array.cast(pa.string())
        elif pa.types.is_integer(typ):
            # Arrow casts integers only to a decimal wide enough for any int64.
            staged = array.cast(pa.decimal256(_ARROW_MAX_PRECISION, 0))
        else:
            staged = array
        return staged.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        _first_misfit(array, precision, scale)
        # Arrow refused a value that check_decimal accepts: refuse the array
        # anyway (refusing is the safe side) and say what Arrow said.
        raise DecimalFitError(
            f"Arrow refused the conversion ({err})", "<array>", precision, scale
        ) from None
