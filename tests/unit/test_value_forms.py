"""Value forms (reconcile.core.value_forms): one spelling per value, as PostgreSQL gives it back."""

from __future__ import annotations

import decimal
import uuid

import pyarrow as pa
import pytest

from reconcile.core.json_text import canonical_json, json_form
from reconcile.core.value_forms import FormError, ValueForm

U = uuid.UUID("0e4f1c2a-9b3d-4c5e-8f60-7a8b9c0d1e2f")


@pytest.mark.parametrize(
    "given", [U, str(U).upper(), "{" + str(U) + "}", "urn:uuid:" + str(U), U.hex, U.bytes]
)
def test_every_uuid_spelling_is_its_lowercase_hyphenated_text(given: object) -> None:
    form = ValueForm("uuid")
    assert form.of_python(given) == str(U)
    array = pa.array([given], pa.binary(16) if isinstance(given, bytes) else None)
    if not isinstance(given, uuid.UUID):
        assert form.of_arrow(array).to_pylist() == [str(U)]


def test_a_bad_uuid_is_refused_with_its_value_and_index() -> None:
    with pytest.raises(FormError, match="not a UUID") as err:
        ValueForm("uuid").of_arrow(pa.array([str(U), None, "nope"]))
    assert (err.value.value, err.value.index) == ("nope", 2)


def test_json_text_is_a_document_and_python_values_are_json() -> None:
    assert json_form('{"b": 1.50, "aa": [1e2, -0.0]}') == '{"b": 1.50, "aa": [100, 0.0]}'
    assert json_form('"a string"') == '"a string"'
    assert json_form({"k": None, "aa": True}) == '{"k": null, "aa": true}'
    assert canonical_json([decimal.Decimal("2.50"), 0.1]) == "[2.50, 0.1]"
    with pytest.raises(FormError, match="not JSON"):
        json_form("{not json")
    with pytest.raises(FormError, match="u0000"):
        json_form({"a": "\x00"})


def test_char_n_is_padded_and_a_longer_value_refused() -> None:
    form = ValueForm("bpchar", 4)
    assert form.of_python("ab") == "ab  " and form.of_python("abcd   ") == "abcd"
    assert form.of_arrow(pa.array(["a", None, "abc "])).to_pylist() == ["a   ", None, "abc "]
    with pytest.raises(FormError, match="longer than 4"):
        form.of_python("abcde")
    assert ValueForm("bpchar").of_python("ab ") == "ab "
