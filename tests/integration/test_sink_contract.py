"""The TwoPhaseSink contract, run against every sink kind through its harness."""

from __future__ import annotations

import pytest

from reconcile.contract import Ok, SinkTxnId
from sinks.base import has_durable_prepare
from tests.harness import SinkHarness, rows_for

pytestmark = pytest.mark.integration

P = "contract"


def _txn(epoch: int, generation: int = 1, sink: str = "s1") -> SinkTxnId:
    return SinkTxnId(P, sink, epoch, generation)


def test_prepared_is_durable_and_invisible_then_commit_makes_it_visible(
    sink_harness: SinkHarness,
) -> None:
    sink = sink_harness.new_sink("s1")
    txn = _txn(0)
    assert sink.stage(txn, rows_for(0)) == Ok()
    assert sink_harness.committed("s1") == {}  # staging shows nothing
    assert sink.prepare(txn) == Ok()
    assert sink_harness.committed("s1") == {}  # prepared is invisible
    restarted = sink_harness.new_sink("s1")
    if has_durable_prepare(sink):
        # A restarted process finds the prepared txn and can commit it.
        assert list(restarted.recover()) == [txn]
        assert restarted.commit(txn) == Ok()
    else:
        # Declared non-durable: a restarted process neither lists nor can
        # commit it (the cycle replays the epoch instead), and says so.
        assert list(restarted.recover()) == []
        assert not restarted.commit(txn)
        assert sink_harness.committed("s1") == {}
        assert sink.commit(txn) == Ok()  # the process that prepared it still can
    assert _plain(sink_harness.committed("s1")) == {0: rows_for(0)}
    assert list(restarted.recover()) == []


def test_commit_twice_is_ok_and_commits_once(sink_harness: SinkHarness) -> None:
    sink = sink_harness.new_sink("s1")
    txn = _txn(1)
    sink.stage(txn, rows_for(1))
    sink.prepare(txn)
    assert sink.commit(txn) == Ok()
    assert sink.commit(txn) == Ok()
    # Another generation committing the same epoch is also a no-op.
    assert sink_harness.new_sink("s1").commit(txn.with_generation(2)) == Ok()
    assert _plain(sink_harness.committed("s1")) == {1: rows_for(1)}


def test_abort_unknown_and_abort_twice_are_ok(sink_harness: SinkHarness) -> None:
    sink = sink_harness.new_sink("s1")
    assert sink.abort(_txn(7)) == Ok()
    txn = _txn(2)
    sink.stage(txn, rows_for(2))
    sink.prepare(txn)
    assert sink.abort(txn) == Ok()
    assert sink.abort(txn) == Ok()
    assert list(sink.recover()) == [] and sink_harness.prepared("s1") == []
    assert sink_harness.committed("s1") == {}


def test_prepare_twice_replaces_rather_than_duplicates(sink_harness: SinkHarness) -> None:
    sink = sink_harness.new_sink("s1")
    txn = _txn(3)
    for _ in range(2):
        sink.stage(txn, rows_for(3))
        assert sink.prepare(txn) == Ok()
    assert list(sink.recover()) == ([txn] if has_durable_prepare(sink) else [])
    assert sink.commit(txn) == Ok()
    assert _plain(sink_harness.committed("s1")) == {3: rows_for(3)}


def test_commit_of_a_never_prepared_txn_is_not_ok(sink_harness: SinkHarness) -> None:
    # Saying OK here would claim an epoch is in the sink when it is not.
    assert not sink_harness.new_sink("s1").commit(_txn(9))
    assert sink_harness.committed("s1") == {}


def test_prepare_without_staging_in_this_process_is_not_ok(sink_harness: SinkHarness) -> None:
    sink = sink_harness.new_sink("s1")
    sink.stage(_txn(4), rows_for(4))
    assert not sink_harness.new_sink("s1").prepare(_txn(4))  # staged rows died with the client
    assert sink_harness.prepared("s1") == []


def test_stale_generation_cannot_write(sink_harness: SinkHarness) -> None:
    new = sink_harness.new_sink("s1")
    new.stage(_txn(5, generation=3), rows_for(5))
    assert new.prepare(_txn(5, generation=3)) == Ok()
    zombie = sink_harness.new_sink("s1")
    zombie.stage(_txn(6, generation=2), [{"k": "e6-zombie", "v": -1}])
    outcome = zombie.prepare(_txn(6, generation=2))
    if outcome:
        outcome = zombie.commit(_txn(6, generation=2))
    assert not outcome
    assert 6 not in sink_harness.committed("s1")
    assert new.commit(_txn(5, generation=3)) == Ok()


def test_sinks_are_isolated_by_name(sink_harness: SinkHarness) -> None:
    one, two = sink_harness.new_sink("s1"), sink_harness.new_sink("s2")
    one.stage(_txn(0, sink="s1"), rows_for(0))
    one.prepare(_txn(0, sink="s1"))
    assert list(two.recover()) == []
    one.commit(_txn(0, sink="s1"))
    assert sink_harness.committed("s2") == {}


def _plain(committed: dict[int, list[dict[str, object]]]) -> dict[int, list[dict[str, object]]]:
    """Drop engine columns (``_epoch`` and the like) and order rows by key."""
    return {
        e: sorted(
            ({k: v for k, v in r.items() if not k.startswith("_")} for r in rows),
            key=lambda r: str(r["k"]),
        )
        for e, rows in committed.items()
    }


def test_stale_leftover_of_an_epoch_committed_by_a_newer_writer(sink_harness: SinkHarness) -> None:
    # A stale writer's prepared batch of epoch 1 survives while a newer writer
    # commits epoch 1. Recovery later commits the leftover under its own (old)
    # txn id: that must be OK (the epoch is in), add nothing, and clear it.
    stale = sink_harness.new_sink("s1")
    stale.stage(_txn(1, generation=1), rows_for(1))
    assert stale.prepare(_txn(1, generation=1)) == Ok()
    if not has_durable_prepare(stale):
        stale.abort(_txn(1, generation=1))  # its open txn dies with its process
    new = sink_harness.new_sink("s1")
    new.stage(_txn(1, generation=2), rows_for(1))
    assert new.prepare(_txn(1, generation=2)) == Ok()
    assert new.commit(_txn(1, generation=2)) == Ok()
    recovering = sink_harness.new_sink("s1")
    for txn in recovering.recover():
        assert recovering.commit(txn) == Ok()
    assert recovering.commit(_txn(1, generation=1)) == Ok()
    assert _plain(sink_harness.committed("s1")) == {1: rows_for(1)}
    assert sink_harness.prepared("s1") == [] and list(recovering.recover()) == []


def test_stale_writer_abort_keeps_the_newer_writers_batch(sink_harness: SinkHarness) -> None:
    new = sink_harness.new_sink("s1")
    new.stage(_txn(2, generation=5), rows_for(2))
    assert new.prepare(_txn(2, generation=5)) == Ok()
    zombie = sink_harness.new_sink("s1")
    zombie.abort(_txn(2, generation=4))  # whatever it answers, it must not discard gen 5
    assert new.commit(_txn(2, generation=5)) == Ok()
    assert _plain(sink_harness.committed("s1")) == {2: rows_for(2)}
