"""Unit tests of the shared decimal rule: exact fits only, one answer for scalars and Arrow."""

from __future__ import annotations

import math
import pickle
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconcile.core.decimals import (
    DecimalFitError,
    arrow_decimal_type,
    check_decimal,
    check_decimal_array,
    decimal_type_name,
)

FITS: list[tuple[Any, int | None, int | None, Decimal]] = [
    (Decimal("1.5"), 12, 2, Decimal("1.5")),
    (Decimal("1.500"), 12, 2, Decimal("1.500")),  # trailing zeros carry nothing
    (Decimal("-9999999999.99"), 12, 2, Decimal("-9999999999.99")),
    (Decimal("0E-10"), 3, 1, Decimal("0E-10")),
    (5, 12, 2, Decimal(5)),
    (1.1, 12, 2, Decimal("1.1")),  # a float is its shortest repr
    (2**70, None, None, Decimal(2**70)),  # unconstrained numeric
    (Decimal("12300"), 5, -2, Decimal("12300")),  # negative scale: hundreds
    (Decimal("0.00123"), 3, 5, Decimal("0.00123")),  # scale above precision
    (Decimal("1E+3"), 4, 0, Decimal("1E+3")),
]

MISFITS: list[tuple[Any, int | None, int | None, str]] = [
    (Decimal("1.005"), 12, 2, "3 digit(s) after the decimal point"),
    (1.005, 12, 2, "3 digit(s) after the decimal point"),
    (0.1 + 0.2, 12, 2, "17 digit(s) after the decimal point"),
    (Decimal("12345678901.5"), 12, 2, "below 1E10"),
    (10**10, 12, 2, "below 1E10"),
    (Decimal("12350"), 5, -2, "after the decimal point"),
    (Decimal("0.0123"), 3, 5, "below 1E-2"),
    (Decimal("NaN"), 12, 2, "not a finite number"),
    (math.inf, None, None, "not a finite number"),
    (float("nan"), None, None, "not a finite number"),
    (Decimal("1E+1000000"), 12, 2, "below 1E10"),
]


@pytest.mark.parametrize(("value", "precision", "scale", "exact"), FITS)
def test_values_that_fit_exactly_are_kept(
    value: Any, precision: int | None, scale: int | None, exact: Decimal
) -> None:
    got = check_decimal(value, precision, scale)
    assert got == exact and str(got) == str(exact)


@pytest.mark.parametrize(("value", "precision", "scale", "why"), MISFITS)
def test_values_that_would_lose_digits_are_refused(
    value: Any, precision: int | None, scale: int | None, why: str
) -> None:
    with pytest.raises(DecimalFitError) as err:
        check_decimal(value, precision, scale)
    message = str(err.value)
    assert why in message, message
    assert (
        decimal_type_name(precision, scale) in message and "refused rather than rounded" in message
    )
    assert err.value.value is value or err.value.value == value or value != value


def test_non_numbers_are_a_type_error() -> None:
    for value in (True, "1.5", None):
        with pytest.raises(TypeError):
            check_decimal(value, 12, 2)


def test_the_error_pickles_with_its_fields() -> None:
    err = DecimalFitError("why", Decimal("1.005"), 12, 2, 7)
    back = pickle.loads(pickle.dumps(err))
    assert (back.reason, back.value, back.precision, back.scale, back.index) == (
        "why",
        Decimal("1.005"),
        12,
        2,
        7,
    )
    assert str(back) == str(err)


def test_arrow_arrays_convert_exactly_and_name_the_first_misfit() -> None:
    decimals = pa.array([Decimal("1.5"), None, Decimal("2.25")])
    got = check_decimal_array(decimals, 12, 2)
    assert got.type == pa.decimal128(12, 2)
    assert got.to_pylist() == [Decimal("1.50"), None, Decimal("2.25")]
    floats = pa.chunked_array([[1.1, None], [2.5, 1.005]])
    with pytest.raises(DecimalFitError) as err:
        check_decimal_array(floats, 12, 2)
    assert err.value.index == 3 and err.value.value == 1.005
    ints = pa.array([1, 99999], pa.int32())
    with pytest.raises(DecimalFitError) as err:
        check_decimal_array(ints, 5, 2)
    assert err.value.index == 1
    assert check_decimal_array(pa.array([12345678901234567890], pa.uint64()), 20, 0).type == (
        pa.decimal128(20, 0)
    )
    assert check_decimal_array(pa.array([Decimal("1.5")]), 50, 2).type == pa.decimal256(50, 2)
    # No Arrow type for it: every value is checked, the array is returned as given.
    assert check_decimal_array(pa.array([12300]), 5, -2).type == pa.int64()
    with pytest.raises(DecimalFitError):
        check_decimal_array(pa.array([12350]), 5, -2)
    with pytest.raises(DecimalFitError) as err:
        check_decimal_array(pa.array([1.0, math.nan]), None, None)
    assert err.value.index == 1
    with pytest.raises(TypeError):
        check_decimal_array(pa.array(["1.5"]), 12, 2)
    encoded = pa.array([1.5, 1.5, 2.0]).dictionary_encode()
    assert check_decimal_array(encoded, 12, 2).to_pylist() == [Decimal("1.50")] * 2 + [
        Decimal("2.00")
    ]


def _agree(values: list[Any], arrow_type: pa.DataType, precision: int, scale: int) -> None:
    """check_decimal_array accepts an array iff check_decimal accepts every value."""
    expected: Exception | None = None
    exact: list[Decimal | None] = []
    for index, value in enumerate(values):
        if value is None:
            exact.append(None)
            continue
        try:
            exact.append(check_decimal(value, precision, scale))
        except DecimalFitError as err:
            expected = err
            first = index
            break
    array = pa.array(values, arrow_type)
    if expected is not None:
        with pytest.raises(DecimalFitError) as err:
            check_decimal_array(array, precision, scale)
        assert err.value.index == first
        return
    got = check_decimal_array(array, precision, scale)
    assert got.to_pylist() == exact


scales = st.integers(0, 6)


@settings(max_examples=600, deadline=None)
@given(
    values=st.lists(st.none() | st.floats(width=64), max_size=8),
    precision=st.integers(1, 20),
    scale=scales,
)
def test_floats_arrow_and_scalar_agree(
    values: list[float | None], precision: int, scale: int
) -> None:
    _agree(values, pa.float64(), precision, max(0, min(scale, precision)))


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(
        st.none()
        | st.decimals(
            places=4, allow_nan=False, allow_infinity=False, min_value=-(10**12), max_value=10**12
        ),
        max_size=8,
    ),
    precision=st.integers(1, 30),
    scale=scales,
)
def test_decimals_arrow_and_scalar_agree(
    values: list[Decimal | None], precision: int, scale: int
) -> None:
    _agree(values, pa.decimal128(17, 4), precision, max(0, min(scale, precision)))


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.none() | st.integers(-(2**63), 2**63 - 1), max_size=8),
    precision=st.integers(1, 40),
    scale=scales,
)
def test_integers_arrow_and_scalar_agree(
    values: list[int | None], precision: int, scale: int
) -> None:
    _agree(values, pa.int64(), precision, max(0, min(scale, precision)))


def test_arrow_decimal_type_bounds() -> None:
    assert arrow_decimal_type(38, 2) == pa.decimal128(38, 2)
    assert arrow_decimal_type(39, 2) == pa.decimal256(39, 2)
    assert arrow_decimal_type(77, 2) is None
    assert arrow_decimal_type(5, -2) is None
    assert arrow_decimal_type(3, 5) is None


@pytest.mark.parametrize(
    ("value", "precision", "scale"),
    [
        (2.2250738585e-313, 2, 2),  # Arrow's string-to-decimal cast reads it as 0.00
        (907598747074959.0, 30, 30),  # the rescaled value wraps around in 128 bits
    ],
)
def test_arrow_cast_pitfalls_are_caught_before_the_cast(
    value: float, precision: int, scale: int
) -> None:
    with pytest.raises(DecimalFitError):
        check_decimal(value, precision, scale)
    with pytest.raises(DecimalFitError) as err:
        check_decimal_array(pa.array([1.0 if precision > scale else 0.5, value]), precision, scale)
    assert err.value.index == 1
