"""Unit tests of the contract types: txn ids, outcomes, errors, change ids."""

from __future__ import annotations

import pickle
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconcile.core.contract import (
    OK,
    Change,
    ConfigurationError,
    ContractViolationError,
    EpochOrderError,
    Fatal,
    FatalError,
    FencedError,
    InvalidInputError,
    OutcomeUnknownError,
    ReconcileError,
    Retryable,
    RetryableError,
    SinkTxnId,
    TxnIdParseError,
    UnknownSinkError,
    validate_name,
)
from reconcile.core.ids import change_id
from sinks.base import check_outcome

names = st.from_regex(r"[A-Za-z0-9_]{1,63}", fullmatch=True)
numbers = st.integers(min_value=0, max_value=2**63 - 1)


@given(names, names, numbers, numbers)
def test_txn_id_round_trips_through_its_string(
    pipeline: str, sink: str, epoch: int, gen: int
) -> None:
    txn = SinkTxnId(pipeline, sink, epoch, gen)
    assert SinkTxnId.from_string(str(txn)) == txn
    assert txn.key == (pipeline, sink, epoch)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "p-s-1",  # no generation
        "p-s-x-g1",
        "p-s-01-g1",  # leading zero: two spellings of one id
        "p-s--1-g1",
        "p-s-1-g1-extra",
        "p;s-1-g1",
        "p-s-99999999999999999999-g0",  # past int64
        'x"; DROP TABLE y; ---s-1-g1',
    ],
)
def test_txn_id_that_does_not_parse_names_the_value(text: str) -> None:
    with pytest.raises(TxnIdParseError, match="cannot parse sink txn id") as info:
        SinkTxnId.from_string(text)
    assert repr(text) in str(info.value)
    assert isinstance(info.value, InvalidInputError)


@pytest.mark.parametrize("bad", ["", "a-b", "a b", "x" * 64, None, 3])
def test_invalid_names_are_rejected(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="sink name"):
        validate_name("sink", bad)


def test_txn_id_rejects_negative_epoch_and_bool() -> None:
    with pytest.raises(InvalidInputError, match="epoch"):
        SinkTxnId("p", "s", -1)
    with pytest.raises(InvalidInputError, match="generation"):
        SinkTxnId("p", "s", 1, True)


@pytest.mark.parametrize(
    "error",
    [
        ReconcileError("root", a=1),
        RetryableError("retry"),
        FatalError("fatal", txn="p-s-1-g0"),
        OutcomeUnknownError("unknown", txns=["p-s-1-g0"]),
        FencedError("fenced", generation=1, current=2),
        TxnIdParseError("bad id", value="'x'"),
        EpochOrderError("backwards", epoch=3),
        UnknownSinkError("who", sinks=["z"]),
        ContractViolationError("broken", sink="s"),
    ],
)
def test_errors_survive_pickling(error: ReconcileError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.details == error.details


def test_retryable_and_unknown_are_distinct_types() -> None:
    # "Failed, safe to retry" and "outcome unknown" must never be confused.
    assert not issubclass(OutcomeUnknownError, RetryableError)
    assert not issubclass(RetryableError, OutcomeUnknownError)
    assert issubclass(FencedError, FatalError)


def test_outcomes_are_values() -> None:
    assert OK and not Retryable("x") and not Fatal("y")
    assert Retryable("x") == Retryable("x")
    assert {OK.kind, Retryable("x").kind, Fatal("y").kind} == {"ok", "retryable", "fatal"}


def test_check_outcome_rejects_non_outcomes() -> None:
    txn = SinkTxnId("p", "s", 1)
    assert check_outcome("s", "prepare", txn, OK) is OK
    for bad in (None, True, "OK", 0, Retryable):
        with pytest.raises(
            ContractViolationError, match=r"sink 's' returned .* from prepare\(p-s-1-g0\)"
        ):
            check_outcome("s", "prepare", txn, bad)


def test_change_rejects_unknown_op() -> None:
    with pytest.raises(InvalidInputError, match="'merge'"):
        Change("merge", {"k": 1})  # type: ignore[arg-type]


def test_change_id_is_stable_and_uuid7_shaped() -> None:
    a = change_id("orders", 42, "offset:17", 3)
    assert a == change_id("orders", 42, "offset:17", 3)
    assert a.version == 7 and a.variant == uuid.RFC_4122
    assert a.int >> 80 == 42  # time bits come from the epoch
    others = {
        change_id("orders", 43, "offset:17", 3),
        change_id("orders", 42, "offset:18", 3),
        change_id("orders", 42, "offset:17", 4),
        change_id("orders2", 42, "offset:17", 3),
        change_id("orders", 42, 17, 3),  # int and str positions differ
    }
    assert a not in others and len(others) == 5
    assert change_id("p", 1, 0, 0, epoch_time_ms=1_700_000_000_000).int >> 80 == 1_700_000_000_000


def test_change_id_sorts_by_epoch() -> None:
    ids = [change_id("p", e, "x", 0) for e in range(50)]
    assert sorted(ids) == ids


def test_capabilities_are_a_value_with_a_fallback_for_older_sinks() -> None:
    from reconcile.core.sink import SinkCapabilities, capabilities_of

    class Declared:
        capabilities = SinkCapabilities(durable_prepare=False, pullable=True)

    class Older:
        durable_prepare = False  # a sink written before capabilities existed

    assert capabilities_of(Declared()) == SinkCapabilities(durable_prepare=False, pullable=True)
    assert capabilities_of(Older()) == SinkCapabilities(durable_prepare=False)
    assert capabilities_of(object()) == SinkCapabilities()
