"""The rule for what a record in a sink may claim (``reconcile.core.claims``), at its edges.

Pure: a claim against a bound, no sink. The edges: the newest decided epoch
itself, one past it, a store that decided nothing, the first and last epoch
of a repair, a generation equal to the fence and one past it, no bound.
"""

from __future__ import annotations

import pickle

import pytest

from reconcile.core.claims import Claim, Decided, check_claim
from reconcile.core.contract import MarkerMismatchError, UntrustedRecordError, WriterIdentity
from reconcile.core.metrics import InMemoryMetrics, activate


def claim(epoch: int | None, first: int | None = None, generation: int | None = None) -> Claim:
    return Claim("orders", "sink 'orders'", "record R", "repair" if first else "commit", epoch,
                 first_epoch=first, generation=generation)  # fmt: skip


@pytest.mark.parametrize(
    ("record", "bound", "trusted"),
    [
        (claim(5), Decided(5, 1), True),  # the newest decided epoch itself
        (claim(6), Decided(5, 1), False),  # one past it
        (claim(0), Decided(None, 1), False),  # the store decided nothing yet
        (claim(5, first=1), Decided(5, 1), True),  # a repair up to the newest decided epoch
        (claim(6, first=1), Decided(5, 1), False),  # a repair one past it
        (claim(5, generation=3), Decided(5, 3), True),  # the fence's own generation
        (claim(5, generation=4), Decided(5, 3), False),  # one past it
        (claim(5, generation=9), Decided(5, None), True),  # no fence known: not checked
        (claim(None, generation=3), Decided(None, 3), True),  # a fence names no epoch
        (claim(None, generation=4), Decided(None, 3), False),
    ],
)
def test_a_record_is_trusted_only_as_far_as_the_store_decided(
    record: Claim, bound: Decided, trusted: bool
) -> None:
    refused = check_claim(record, bound)
    assert (refused is None) is trusted, refused


def test_no_bound_means_nothing_to_check_against() -> None:
    assert check_claim(claim(10**6, first=1), None) is None
    assert WriterIdentity("p", "log").decisions is None


def test_a_refusal_names_the_record_and_its_epochs_is_counted_and_pickles() -> None:
    metrics = InMemoryMetrics()
    with activate(metrics):
        refused = check_claim(claim(1_000_000, first=1, generation=1), Decided(2, 1))
    assert isinstance(refused, UntrustedRecordError) and isinstance(refused, MarkerMismatchError)
    text = str(refused)
    assert "sink 'orders'" in text and "record R" in text and "epochs 1 to 1000000" in text
    assert "epochs up to 2" in text
    assert refused.details["first_epoch"] == 1 and refused.details["epoch"] == 1_000_000
    assert metrics.value("sink.untrusted_record", sink="orders", kind="repair") == 1
    again = pickle.loads(pickle.dumps(refused))
    assert type(again) is UntrustedRecordError and again.details == refused.details


def test_the_bound_is_read_at_each_question() -> None:
    class Log:
        epoch = 2

        def decided(self) -> Decided:
            return Decided(self.epoch, 1)

    log = Log()
    assert check_claim(claim(3), log) is not None
    log.epoch = 3  # decided since: the same record is now within the bound
    assert check_claim(claim(3), log) is None
