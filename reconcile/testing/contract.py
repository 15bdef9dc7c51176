"""The TwoPhaseSink contract as checks: each one a rule every sink must keep.

Each check takes a :class:`~reconcile.testing.harness.SinkHarness` and raises
:class:`ContractCheckError` naming the rule it found broken. The built-in sinks
run every check in the project's own suite; a sink author runs them all with
:func:`reconcile.testing.check_sink`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reconcile.core.claims import Decided
from reconcile.core.contract import (
    Fatal,
    MarkerMismatchError,
    Ok,
    SinkOutcome,
    SinkTxnId,
    UntrustedRecordError,
    WriterIdentity,
)
from reconcile.core.sink import bind_writer, has_durable_prepare
from reconcile.testing.harness import ChaosRow, SinkHarness, rows_for

__all__ = ["CONTRACT_CHECKS", "ContractCheckError", "expect"]

P = "contract"


class ContractCheckError(AssertionError):
    """A sink broke a rule of the contract; the message names the rule and what happened."""


def expect(condition: object, message: str) -> None:
    """Raise ContractCheckError(message) unless ``condition`` holds (asserts survive -O)."""
    if not condition:
        raise ContractCheckError(message)


def _txn(epoch: int, generation: int = 1, sink: str = "s1") -> SinkTxnId:
    return SinkTxnId(P, sink, epoch, generation)


def _ok(outcome: SinkOutcome, what: str) -> None:
    expect(isinstance(outcome, Ok), f"{what} must return OK, got {outcome!r}")


def _plain(committed: dict[int, list[ChaosRow]]) -> dict[int, list[ChaosRow]]:
    """Drop engine columns (``_epoch`` and the like) and order rows by key."""
    return {
        e: sorted(
            ({k: v for k, v in r.items() if not str(k).startswith("_")} for r in rows),
            key=lambda r: str(r["k"]),
        )
        for e, rows in committed.items()
    }


def _close(*sinks: Any) -> None:
    for sink in sinks:
        close = getattr(sink, "close", None)
        if close is not None:
            close()


def prepared_is_durable_and_invisible(harness: SinkHarness) -> None:
    """prepare makes a batch durable but invisible; commit makes it visible, atomically."""
    sink = harness.new_sink("s1")
    txn = _txn(0)
    _ok(sink.stage(txn, rows_for(0)), "stage")
    expect(harness.committed("s1") == {}, "staged rows must not be visible")
    _ok(sink.prepare(txn), "prepare")
    expect(harness.committed("s1") == {}, "prepared rows must not be visible before commit")
    restarted = harness.new_sink("s1")
    if has_durable_prepare(sink):
        # A restarted process finds the prepared txn and can commit it.
        expect(list(restarted.recover()) == [txn], "recover() after a restart must list the txn")
        _ok(restarted.commit(txn), "commit by a restarted process of a durable prepare")
    else:
        # Declared non-durable: a restarted process neither lists nor can
        # commit it (the cycle replays the epoch instead), and says so.
        expect(list(restarted.recover()) == [], "a non-durable prepare must not be listed")
        expect(not restarted.commit(txn), "a non-durable prepare must not commit elsewhere")
        expect(harness.committed("s1") == {}, "nothing may be visible after that refusal")
        _ok(sink.commit(txn), "commit by the process that prepared it")
    expect(_plain(harness.committed("s1")) == {0: rows_for(0)}, "the epoch, once, after commit")
    expect(list(restarted.recover()) == [], "nothing left prepared after commit")
    _close(sink, restarted)


def commit_is_idempotent_by_epoch(harness: SinkHarness) -> None:
    """commit twice is OK and writes once; another generation's commit of it is OK too."""
    sink = harness.new_sink("s1")
    txn = _txn(1)
    sink.stage(txn, rows_for(1))
    _ok(sink.prepare(txn), "prepare")
    _ok(sink.commit(txn), "commit")
    _ok(sink.commit(txn), "a second commit of the same txn")
    # Idempotency keys on (pipeline, sink, epoch), not on the generation.
    other = harness.new_sink("s1")
    _ok(other.commit(txn.with_generation(2)), "commit of the committed epoch by generation 2")
    expect(_plain(harness.committed("s1")) == {1: rows_for(1)}, "the epoch must be in once")
    _close(sink, other)


def abort_is_idempotent(harness: SinkHarness) -> None:
    """abort of an unknown txn is OK; abort twice is OK; an aborted txn leaves nothing."""
    sink = harness.new_sink("s1")
    _ok(sink.abort(_txn(7)), "abort of an unknown txn")
    txn = _txn(2)
    sink.stage(txn, rows_for(2))
    sink.prepare(txn)
    _ok(sink.abort(txn), "abort of a prepared txn")
    _ok(sink.abort(txn), "a second abort")
    expect(list(sink.recover()) == [] and harness.prepared("s1") == [], "nothing left prepared")
    expect(harness.committed("s1") == {}, "nothing of an aborted txn is visible")
    _close(sink)


def prepare_twice_replaces(harness: SinkHarness) -> None:
    """preparing again replaces the prepared batch; it never adds a second one."""
    sink = harness.new_sink("s1")
    txn = _txn(3)
    for _ in range(2):
        sink.stage(txn, rows_for(3))
        _ok(sink.prepare(txn), "prepare")
    want = [txn] if has_durable_prepare(sink) else []
    expect(list(sink.recover()) == want, f"recover() must list {want}")
    _ok(sink.commit(txn), "commit")
    expect(_plain(harness.committed("s1")) == {3: rows_for(3)}, "the epoch must be in once")
    _close(sink)


def commit_of_unprepared_is_not_ok(harness: SinkHarness) -> None:
    """commit of a txn that was never prepared is not OK (OK would claim a hole is in)."""
    sink = harness.new_sink("s1")
    expect(not sink.commit(_txn(9)), "commit of a never-prepared txn must not be OK")
    expect(harness.committed("s1") == {}, "and nothing may be written")
    _close(sink)


def staged_rows_die_with_the_client(harness: SinkHarness) -> None:
    """prepare in a client that did not stage the txn is not OK (staged rows are in memory)."""
    sink = harness.new_sink("s1")
    sink.stage(_txn(4), rows_for(4))
    other = harness.new_sink("s1")
    expect(not other.prepare(_txn(4)), "prepare of rows staged in another client must fail")
    expect(harness.prepared("s1") == [], "and nothing may be prepared")
    _close(sink, other)


def stale_generation_cannot_write(harness: SinkHarness) -> None:
    """a writer of an older generation is refused once a newer one has written (fencing).

    While the newer writer's txn is still open the stale one may be told to
    retry (a lock it cannot get); once the newer txn committed, it gets Fatal.
    Either way it writes nothing.
    """
    new = harness.new_sink("s1")
    new.stage(_txn(5, generation=3), rows_for(5))
    _ok(new.prepare(_txn(5, generation=3)), "prepare by generation 3")
    zombie = harness.new_sink("s1")
    stale = _txn(6, generation=2)

    def attempt() -> SinkOutcome:
        zombie.stage(stale, [{"k": "e6-zombie", "v": -1}])
        outcome = zombie.prepare(stale)
        # A sink may fence at prepare or at commit; one of them must refuse.
        return zombie.commit(stale) if outcome else outcome

    outcome = attempt()
    expect(not isinstance(outcome, Ok), f"a stale generation must be refused, got {outcome!r}")
    _ok(new.commit(_txn(5, generation=3)), "commit by generation 3")
    outcome = attempt()
    expect(isinstance(outcome, Fatal), f"a stale generation must get Fatal, got {outcome!r}")
    expect(6 not in harness.committed("s1"), "a stale generation must write nothing")
    _close(new, zombie)


def sinks_are_isolated_by_name(harness: SinkHarness) -> None:
    """two sinks of one external system never see each other's txns."""
    one, two = harness.new_sink("s1"), harness.new_sink("s2")
    one.stage(_txn(0, sink="s1"), rows_for(0))
    one.prepare(_txn(0, sink="s1"))
    expect(list(two.recover()) == [], "recover() of s2 must not list s1's txn")
    one.commit(_txn(0, sink="s1"))
    expect(harness.committed("s2") == {}, "s1's commit must not show in s2")
    _close(one, two)


def committed_epoch_is_ok_before_the_fence(harness: SinkHarness) -> None:
    """commit of an epoch already in is OK whoever asks, and clears a stale leftover.

    A stale writer's prepared batch of epoch 1 survives while a newer writer
    commits epoch 1; recovery later commits the leftover under its old txn id.
    That must be OK (the epoch is in), add nothing, and clear the leftover.
    """
    stale = harness.new_sink("s1")
    stale.stage(_txn(1, generation=1), rows_for(1))
    _ok(stale.prepare(_txn(1, generation=1)), "prepare by generation 1")
    if not has_durable_prepare(stale):
        stale.abort(_txn(1, generation=1))  # its open txn dies with its process
    new = harness.new_sink("s1")
    new.stage(_txn(1, generation=2), rows_for(1))
    _ok(new.prepare(_txn(1, generation=2)), "prepare by generation 2")
    _ok(new.commit(_txn(1, generation=2)), "commit by generation 2")
    recovering = harness.new_sink("s1")
    for txn in recovering.recover():
        _ok(recovering.commit(txn), f"commit of the leftover {txn}")
    _ok(recovering.commit(_txn(1, generation=1)), "commit of the epoch by the stale generation")
    expect(_plain(harness.committed("s1")) == {1: rows_for(1)}, "the epoch must be in once")
    expect(harness.prepared("s1") == [] and list(recovering.recover()) == [], "no leftover")
    _close(stale, new, recovering)


def stale_abort_keeps_the_newer_batch(harness: SinkHarness) -> None:
    """a stale writer's abort never discards a newer writer's prepared batch of the epoch."""
    new = harness.new_sink("s1")
    new.stage(_txn(2, generation=5), rows_for(2))
    _ok(new.prepare(_txn(2, generation=5)), "prepare by generation 5")
    zombie = harness.new_sink("s1")
    zombie.abort(_txn(2, generation=4))  # whatever it answers, it must not discard gen 5
    _ok(new.commit(_txn(2, generation=5)), "commit by generation 5 after a stale abort")
    expect(_plain(harness.committed("s1")) == {2: rows_for(2)}, "the epoch must be in once")
    _close(new, zombie)


def committed_epoch_prepare_ok_abort_fatal(harness: SinkHarness) -> None:
    """prepare of an epoch that is in is OK and writes nothing; abort of it is Fatal."""
    sink = harness.new_sink("s1")
    txn = _txn(8)
    sink.stage(txn, rows_for(8))
    _ok(sink.prepare(txn), "prepare")
    _ok(sink.commit(txn), "commit")
    before = harness.committed("s1")
    again = harness.new_sink("s1")
    again.stage(txn.with_generation(2), rows_for(8, nonce=7))  # a replay computes new values
    _ok(again.prepare(txn.with_generation(2)), "prepare of an epoch that is already in")
    _ok(again.commit(txn.with_generation(2)), "commit of an epoch that is already in")
    aborted = again.abort(txn.with_generation(2))
    expect(isinstance(aborted, Fatal), f"abort of a committed epoch must be Fatal: {aborted!r}")
    expect(harness.committed("s1") == before, "a replay of a committed epoch must write nothing")
    _close(sink, again)


def another_logs_commit_is_never_ok(harness: SinkHarness) -> None:
    """a commit recorded by another progress log is never taken as "already committed".

    Only for sinks with ``bind``: the epoch committed under log A, then a
    writer bound to log B (a fresh or wiped state, same names) must be refused,
    never told the epoch is in.
    """
    first = harness.new_sink("s1")
    if getattr(first, "bind", None) is None:
        _close(first)
        return
    bind_writer(first, WriterIdentity(P, "log-a"))
    txn = _txn(0)
    first.stage(txn, rows_for(0))
    _ok(first.prepare(txn), "prepare under log A")
    _ok(first.commit(txn), "commit under log A")
    before = harness.committed("s1")
    fresh = harness.new_sink("s1")
    try:
        bind_writer(fresh, WriterIdentity(P, "log-b"))
    except MarkerMismatchError:
        outcome: SinkOutcome = Fatal("refused at bind")  # refusing at start-up is fine
    else:
        fresh.stage(txn.with_generation(2), rows_for(0, nonce=3))
        outcome = fresh.prepare(txn.with_generation(2))
        if outcome:
            outcome = fresh.commit(txn.with_generation(2))
    expect(not isinstance(outcome, Ok), "another log's commit must never answer OK")
    expect(harness.committed("s1") == before, "and nothing may be written")
    _close(first, fresh)


def an_undecided_commit_is_never_ok(harness: SinkHarness) -> None:
    """a commit of an epoch the store never decided is refused, never "already committed".

    Only for sinks with ``bind``: epoch 3 is committed under log A by a writer
    bound without a store (what a co-tenant copying the log id writes). A
    writer of log A whose store decided epochs up to 2 must be refused with an
    UntrustedRecordError, and nothing written; one whose store decided epoch 3
    finds it in (``reconcile.core.claims``).
    """
    forger = harness.new_sink("s1")
    if getattr(forger, "bind", None) is None:
        _close(forger)
        return
    bind_writer(forger, WriterIdentity(P, "log-a"))
    txn = _txn(3)
    forger.stage(txn, rows_for(3))
    _ok(forger.prepare(txn), "prepare without a store")
    _ok(forger.commit(txn), "commit without a store")
    before = harness.committed("s1")
    behind = harness.new_sink("s1")
    bind_writer(behind, WriterIdentity(P, "log-a", decisions=Decided(epoch=2, generation=1)))
    behind.stage(txn, rows_for(3, nonce=5))
    for operation in ("prepare", "commit"):
        outcome = getattr(behind, operation)(txn)
        expect(
            isinstance(outcome, Fatal) and isinstance(outcome.error, UntrustedRecordError),
            f"{operation} of an epoch the store never decided must be Fatal "
            f"(UntrustedRecordError), got {outcome!r}",
        )
    expect(harness.committed("s1") == before, "and nothing may be written")
    decided = harness.new_sink("s1")
    bind_writer(decided, WriterIdentity(P, "log-a", decisions=Decided(epoch=3, generation=1)))
    decided.stage(txn, rows_for(3, nonce=6))
    _ok(decided.prepare(txn), "prepare of an epoch the store decided and the sink holds")
    _ok(decided.commit(txn), "commit of an epoch the store decided and the sink holds")
    expect(harness.committed("s1") == before, "a replay of a decided epoch writes nothing")
    _close(forger, behind, decided)


CONTRACT_CHECKS: list[Callable[[SinkHarness], None]] = [
    prepared_is_durable_and_invisible,
    commit_is_idempotent_by_epoch,
    abort_is_idempotent,
    prepare_twice_replaces,
    commit_of_unprepared_is_not_ok,
    staged_rows_die_with_the_client,
    stale_generation_cannot_write,
    sinks_are_isolated_by_name,
    committed_epoch_is_ok_before_the_fence,
    stale_abort_keeps_the_newer_batch,
    committed_epoch_prepare_ok_abort_fatal,
    another_logs_commit_is_never_ok,
    an_undecided_commit_is_never_ok,
]
