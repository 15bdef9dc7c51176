"""Calling every sink for one step of the cycle: outcomes checked, retries, replays, aborts."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from reconcile.core.contract import (
    ContractViolationError,
    Fatal,
    FatalError,
    FencedError,
    InvalidInputError,
    Ok,
    OutcomeUnknownError,
    ReconcileError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
)
from reconcile.core.decisions import deterministic_error
from reconcile.core.logs import context
from reconcile.core.metrics import Metrics, timed
from reconcile.core.sink import TwoPhaseSink, check_outcome, has_durable_prepare
from reconcile.engine.faults import FaultPlan

__all__ = ["SinkSteps", "StepFailed", "failed_at_commit_point", "run_step"]

log = logging.getLogger("reconcile.cycle")


class StepFailed(Exception):
    """A step of the cycle failed; says whether a retry can fix it, and why."""

    def __init__(
        self,
        step: str,
        reason: str,
        *,
        fatal: bool,
        definite: bool = True,
        error: ReconcileError | None = None,
    ) -> None:
        super().__init__(reason)
        self.step, self.reason, self.fatal = step, reason, fatal
        # definite: we know the step did not take effect (an outcome, or a
        # rejection); otherwise an exception left its effect unknown.
        self.definite = definite
        self.error = error


def failed_at_commit_point(failed: StepFailed | ContractViolationError) -> bool:
    """Whether a failure came from the commit point (after the expected state was recorded)."""
    return isinstance(failed, StepFailed) and failed.step == "commit_progress"


def run_step(
    faults: FaultPlan,
    metrics: Metrics,
    step: str,
    action: Callable[[], object],
    *,
    fatal: bool = False,
) -> None:
    """Run one cycle step under its fault point and timer; map failures to StepFailed."""
    with timed(metrics, f"cycle.step.{step}"):
        try:
            injected = faults.hit(f"cycle.{step}")
            if isinstance(injected, Retryable | Fatal):
                raise StepFailed(
                    step,
                    injected.reason,
                    fatal=fatal or isinstance(injected, Fatal),
                    error=injected.error,
                )
            action()
            faults.hit(f"cycle.{step}", "after")
        except (StepFailed, ContractViolationError):
            raise
        except (FencedError, InvalidInputError, FatalError) as exc:
            # A definite refusal by the log: a zombie must stop, whatever
            # step it was in; an illegal move is a bug no retry fixes.
            raise StepFailed(step, str(exc), fatal=True, error=exc) from exc
        except RetryableError as exc:
            raise StepFailed(step, str(exc), fatal=fatal, error=exc) from exc
        except Exception as exc:
            same_again = deterministic_error(exc, f"step {step}")
            if same_again is not None:
                # Its effect is as unknown as any exception's (definite=False:
                # at the commit point the restart's start() settles it), but
                # the error is the same on every attempt: the driver stops at
                # once instead of restarting to meet it again.
                raise StepFailed(
                    step, same_again.message, fatal=True, definite=False, error=same_again
                ) from exc
            raise StepFailed(
                step, f"{type(exc).__name__}: {exc}", fatal=fatal, definite=False
            ) from exc


def _rows_to_replay(outputs: Mapping[str, Iterable[Any]] | None, name: str) -> Iterable[Any] | None:
    """The rows to write into ``name`` again; None when there are none at hand.

    A plain outputs mapping gives an empty batch for a sink it does not name (a
    declared sink without rows); a ``strict`` one (recorded changes) does not.
    """
    if outputs is None:
        return None
    try:
        return outputs[name]
    except KeyError:
        return None if getattr(outputs, "strict", False) else ()


def _cause(outcome: SinkOutcome) -> ReconcileError | None:
    return outcome.error if isinstance(outcome, Retryable | Fatal) else None


class SinkSteps:
    """Runs one operation on every sink of a pipeline, in declaration order.

    The cycle decides the order of the steps; this class makes each call,
    checks what comes back against the contract, and retries what the
    contract says is safe to retry (every sink operation is idempotent).
    """

    def __init__(
        self, sinks: Mapping[str, TwoPhaseSink], metrics: Metrics, commit_attempts: int
    ) -> None:
        self.sinks = sinks
        self.metrics = metrics
        self.commit_attempts = commit_attempts

    def try_op(self, sink: TwoPhaseSink, operation: str, txn: SinkTxnId) -> SinkOutcome:
        """Run an idempotent txn operation, retrying Retryable outcomes and exceptions."""
        outcome: SinkOutcome = Retryable("not tried")
        for _ in range(self.commit_attempts):
            try:
                with context(sink=sink.name, txn=str(txn)):
                    outcome = check_outcome(
                        sink.name, operation, txn, getattr(sink, operation)(txn)
                    )
            except (ContractViolationError, OutcomeUnknownError):
                # A sink that says it cannot tell (I4) is not retried into a
                # guess, nor replayed over: the error reaches the operator.
                raise
            except Exception as exc:
                outcome = Retryable(repr(exc))
            if isinstance(outcome, Ok | Fatal):
                break
            self.metrics.count(f"sink.{operation}.retryable", sink=sink.name)
        return outcome

    def settle(
        self, sink: TwoPhaseSink, operation: str, txn: SinkTxnId, *, what: str = "stranded txn"
    ) -> None:
        """Commit or abort ``txn`` during recovery, or raise naming it and ``what`` it is."""
        outcome = self.try_op(sink, operation, txn)
        if isinstance(outcome, Ok):
            return
        message = (
            f"recovery could not {operation} {what} {txn} in sink {sink.name!r}: {outcome.reason}"
        )
        if isinstance(outcome, Retryable):
            # The sink is down or busy: start() may be tried again, as the same writer.
            raise RetryableError(message, txn=str(txn))
        raise FatalError(message, txn=str(txn), error=outcome.error)

    def each(
        self,
        operation: str,
        txns: Mapping[str, SinkTxnId],
        args: Callable[[str], tuple[Any, ...]] = lambda name: (),
    ) -> None:
        """Run stage or prepare on every sink; raise StepFailed on the first failure."""
        for name, sink in self.sinks.items():
            txn = txns[name]
            try:
                with context(sink=name, txn=str(txn)):
                    value = getattr(sink, operation)(txn, *args(name))
            except Exception as exc:
                # Before the commit point an unknown outcome is harmless: the
                # epoch is aborted everywhere, and abort is idempotent. An error
                # that is the same on every attempt stops the pipeline instead
                # of being retried until the retry policy gives up.
                same_again = deterministic_error(exc, f"sink {name!r} {operation}({txn})")
                value = (
                    Retryable(f"{type(exc).__name__}: {exc}")
                    if same_again is None
                    else Fatal.of(same_again)
                )
            outcome = check_outcome(name, operation, txn, value)
            if not isinstance(outcome, Ok):
                raise StepFailed(
                    operation,
                    f"sink {name!r} {operation}({txn}): {outcome.reason}",
                    fatal=isinstance(outcome, Fatal),
                    error=_cause(outcome),
                )

    def commit_all(
        self,
        epoch: int,
        txns: Mapping[str, SinkTxnId],
        outputs: Mapping[str, Iterable[Any]] | None,
    ) -> None:
        """Commit ``epoch`` in every sink, replaying it where a prepare was not durable."""
        for name, sink in self.sinks.items():
            txn = txns[name]
            outcome = self.try_op(sink, "commit", txn)
            if isinstance(outcome, Ok):
                continue
            if has_durable_prepare(sink):
                # A durable prepare that will not commit: stop; start() retries it.
                raise StepFailed(
                    "commit",
                    f"sink {name!r} commit({txn}): {outcome.reason}",
                    fatal=True,
                    error=_cause(outcome),
                )
            # The sink's open txn is gone (a dropped connection, an aborted
            # ambiguous COMMIT, a restart) and the epoch is not in it, while the
            # log says the epoch committed: replay its outputs into this sink.
            # Its commit marker makes the replay exactly-once.
            rows = _rows_to_replay(outputs, name)
            if rows is None:
                raise StepFailed(
                    "commit",
                    f"epoch {epoch} is committed but sink {name!r} lacks it and cannot keep a "
                    f"prepared txn across restarts: run_epoch({epoch}, outputs) to replay it",
                    fatal=True,
                    error=_cause(outcome),
                )
            self.metrics.count("sink.commit.replayed", sink=name)
            for operation, args in (("stage", (rows,)), ("prepare", ())):
                step = check_outcome(name, operation, txn, getattr(sink, operation)(txn, *args))
                if not isinstance(step, Ok):
                    raise StepFailed(
                        "commit",
                        f"replay of {txn} into sink {name!r}: {operation}: {step.reason}",
                        fatal=True,
                        error=_cause(step),
                    )
            outcome = self.try_op(sink, "commit", txn)
            if not isinstance(outcome, Ok):
                raise StepFailed(
                    "commit",
                    f"replay of {txn} into sink {name!r}: commit: {outcome.reason}",
                    fatal=True,
                    error=_cause(outcome),
                )

    def replay(self, sink: TwoPhaseSink, txn: SinkTxnId, rows: Iterable[Any]) -> None:
        """Write ``rows`` into ``sink`` as ``txn`` again (stage, prepare, commit), during recovery.

        Raises:
            RetryableError: a step did not take effect; start() may be tried again.
            FatalError: a step cannot succeed (with the sink's typed cause).
        """
        for operation, args in (("stage", (rows,)), ("prepare", ())):
            step = check_outcome(sink.name, operation, txn, getattr(sink, operation)(txn, *args))
            if not isinstance(step, Ok):
                kind = RetryableError if isinstance(step, Retryable) else FatalError
                raise kind(
                    f"recovery could not write committed epoch {txn} into sink "
                    f"{sink.name!r}: {operation}: {step.reason}",
                    txn=str(txn),
                )
        self.settle(sink, "commit", txn, what="replayed epoch")

    def abort_all(self, txns: Mapping[str, SinkTxnId]) -> None:
        """Abort a txn in every sink; a failure is logged, never raised over the first error."""
        for name, sink in self.sinks.items():
            try:
                outcome = sink.abort(txns[name])
                if not isinstance(outcome, Ok):
                    # Expected after some failed prepares (e.g. a sink that holds
                    # the epoch already): worth a line, not a warning.
                    log.info("abort of %s in sink %r: %s", txns[name], name, outcome)
            except Exception:
                # A failed abort leaves a prepared txn at worst; start() aborts
                # it on restart, since the log never says it committed.
                log.exception("abort of %s in sink %r failed", txns[name], name)
