"""The one classification of failures (``reconcile.decisions.classify``) and RejectedError."""

from __future__ import annotations

import pickle

from reconcile.contract import (
    ConfigurationError,
    ContractViolationError,
    EpochOrderError,
    FatalError,
    FencedError,
    MarkerMismatchError,
    OutcomeUnknownError,
    RejectedError,
    RetryableError,
)
from reconcile.decisions import (
    REJECTING_SQLSTATE,
    Failure,
    classify,
    is_rejection_sqlstate,
    is_terminal,
    rejection_of,
)
from reconcile.ha.takeover import LeadershipLostError


def rejected() -> RejectedError:
    return RejectedError.of(epoch=7, table="shop.order_lines", sqlstate="23502", sink="lines",
                            reason='null value in column "qty" violates not-null constraint',
                            column="qty")  # fmt: skip


def test_the_rejecting_sqlstates_are_the_definite_refusals() -> None:
    assert sorted(REJECTING_SQLSTATE) == ["21", "22", "23", "42", "44", "54"]
    for state in ("23514", "23505", "23502", "23503", "23P01", "22003", "22P02", "42501",
                  "42703", "44000", "21000", "54000"):  # fmt: skip
        assert is_rejection_sqlstate(state), state
    # What may pass on a retry: connection, serialization, resources, lock and
    # statement timeouts, a terminated backend, internal errors; and no state.
    for state in ("08006", "40001", "40P01", "53100", "53300", "55P03", "57014", "57P01",
                  "XX000", "0A000", "25P02", "", None, "23", "235140"):  # fmt: skip
        assert not is_rejection_sqlstate(state), state


def test_every_error_has_one_verdict() -> None:
    assert classify(rejected()) is Failure.REJECTED
    # Carried as the typed cause (recovery's FatalError), or chained: still a rejection.
    assert classify(FatalError("recovery could not commit", error=rejected())) is Failure.REJECTED
    try:
        raise RuntimeError("py4j wrapper") from rejected()
    except RuntimeError as wrapped:
        assert rejection_of(wrapped) is wrapped.__cause__
    assert classify(FencedError("newer")) is Failure.FENCED
    assert classify(LeadershipLostError("lease gone")) is Failure.FENCED
    for terminal in (ConfigurationError("x"), EpochOrderError("x"), ContractViolationError("x"),
                     MarkerMismatchError("x")):  # fmt: skip
        assert classify(terminal) is Failure.TERMINAL, terminal
    for transient in (RetryableError("x"), FatalError("x"), OutcomeUnknownError("x"),
                      RuntimeError("x"), None):  # fmt: skip
        assert classify(transient) is Failure.TRANSIENT, transient
    assert is_terminal(rejected()) and not is_terminal(FatalError("x"))


def test_a_rejection_says_where_on_one_line_and_survives_pickling() -> None:
    error = rejected()
    text = str(error)
    assert "\n" not in text
    assert text.startswith("epoch 7: rejected by the database: table shop.order_lines, column qty")
    assert "[23502]" in text and "nothing of the epoch was written" in text
    back = pickle.loads(pickle.dumps(error))  # executors send errors to the driver
    assert type(back) is RejectedError and str(back) == text
    assert (back.epoch, back.table, back.sqlstate) == (7, "shop.order_lines", "23502")
    assert back.details["column"] == "qty" and back.details["constraint"] is None
    assert isinstance(back, FatalError)
    named = RejectedError.of(epoch=1, table="t", sqlstate="23514", reason="multi\n  line",
                             constraint="c", column="ignored")  # fmt: skip
    assert ", constraint c [23514]: multi line;" in str(named)
