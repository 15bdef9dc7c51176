"""The one classification of failures, RejectedError, and what an HA node does with a failure."""

from __future__ import annotations

import pickle

import pytest

from reconcile.core.contract import (
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
from reconcile.core.decisions import (
    REJECTING_SQLSTATE,
    Failure,
    classify,
    is_rejection_sqlstate,
    is_terminal,
    rejection_of,
)
from reconcile.engine.cycle import CommitCycle
from reconcile.ha import HaNode
from reconcile.ha.leading import AfterFailure, QueryFailures
from reconcile.ha.takeover import LeadershipLostError
from sinks.postgres.lease import PgLease


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


def test_what_a_failed_query_calls_for() -> None:
    failures = QueryFailures("p", limit=3, max_wait_s=1.0)
    assert failures.decide(FencedError("newer"), 4, "x", 0.1) == AfterFailure("step_down", "fenced")
    stop = failures.decide(rejected(), 7, "x", 0.1)
    assert (stop.action, stop.reason, stop.error) == ("stop", "rejected", stop.error)
    assert isinstance(stop.error, RejectedError)
    config = failures.decide(ConfigurationError("no CREATE"), 7, "x", 0.1)
    assert (config.action, config.reason) == ("stop", "error")
    assert failures.failures == 0  # none of those counts towards the limit
    # Anything else: the same epoch again, waits doubling, until the limit stops it.
    waits = [failures.decide(RuntimeError("spark"), 4, "spark", 0.1) for _ in range(2)]
    assert [(a.action, a.wait_s) for a in waits] == [("restart", 0.2), ("restart", 0.4)]
    last = failures.decide(None, 4, "concurrent update", 0.1)
    assert (last.action, last.reason) == ("stop", "query failing")
    assert "epoch 4 failed 3 times in a row" in str(last.error)
    assert "concurrent update" in str(last.error) and not is_terminal(last.error)
    # Another epoch, or a commit, starts the count again; the wait is capped.
    fresh = QueryFailures("p", limit=3, max_wait_s=1.0)
    assert fresh.decide(None, 1, "x", 0.4).wait_s == 0.8
    assert fresh.decide(None, 2, "x", 0.4).action == "restart" and fresh.failures == 1
    assert fresh.decide(None, 2, "x", 0.4).wait_s == 1.0
    fresh.committed()
    assert fresh.decide(None, 2, "x", 0.4).action == "restart" and fresh.failures == 1


class _Refused(PgLease):
    """A lease whose database refuses the role (a ConfigurationError, as the lease raises it)."""

    tries = 0

    def try_acquire(self) -> None:
        self.tries += 1
        raise ConfigurationError("lease of pipeline 'p': the role may not CREATE its table")


def test_a_lease_the_role_may_not_use_stops_the_node_at_once() -> None:
    lease = _Refused("host=127.0.0.1 port=9 dbname=x user=u", "p", term_s=0.2)

    def build() -> CommitCycle:
        raise AssertionError("no cycle is built without the lease")

    node = HaNode(None, build, lease=lease, checkpoint="c", staging="s", warm=False)
    with pytest.raises(ConfigurationError, match="may not CREATE"):
        node.run()
    assert lease.tries == 1  # not tried again: no retry can cure it


def test_the_engines_own_rejection_is_a_rejection_for_every_caller() -> None:
    from reconcile.cli.run import EXIT_ERROR, EXIT_REJECTED, exit_code
    from reconcile.core.contract import InvalidInputError, RowsRejectedError

    # What the sink's check raises for a NULL in a NOT NULL column, before
    # anything is sent: the same verdict, exit code and HA decision as the
    # database's refusal of the same row.
    engine = RowsRejectedError("postgres sink 'lines', table shop.order_lines column 'qty' "
                               "value None: NULL in NOT NULL column (row 0) (epoch 7); nothing "
                               "was written", epoch=7, table="shop.order_lines", sink="lines",
                               column="qty", sqlstate="23502")  # fmt: skip
    for error in (engine, rejected()):
        assert classify(error) is Failure.REJECTED and rejection_of(error) is error
        assert exit_code(error) == EXIT_REJECTED == 3
        stop = QueryFailures("p", limit=3, max_wait_s=1.0).decide(error, 7, "x", 0.1)
        assert (stop.action, stop.reason) == ("stop", "rejected")
    # Still bad input to code that asks for that; and it survives pickling.
    assert isinstance(engine, InvalidInputError)
    back = pickle.loads(pickle.dumps(engine))
    assert type(back) is RowsRejectedError and (back.epoch, back.sqlstate) == (7, "23502")
    assert exit_code(ConfigurationError("x")) == exit_code(RuntimeError("x")) == EXIT_ERROR == 2
