"""The commit cycle: the coordinator that owns the order of every epoch's 2PC steps."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reconcile.contract import (
    ConfigurationError,
    ContractViolationError,
    EpochOrderError,
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
    UnknownSinkError,
    WriterIdentity,
    validate_name,
)
from reconcile.faults import FaultPlan
from reconcile.metrics import Metrics, NullMetrics, timed
from reconcile.progress import EpochStatus, ProgressLog
from sinks.base import TwoPhaseSink, bind_writer, check_outcome, has_durable_prepare

__all__ = [
    "CommitAborted",
    "CommitCycle",
    "CommitFatal",
    "CommitResult",
    "CommitSucceeded",
    "RecoveryReport",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitSucceeded:
    """Epoch ``epoch`` is in every sink. ``replayed``: it already was, nothing ran."""

    epoch: int
    replayed: bool = False
    finalized: bool = True


@dataclass(frozen=True)
class CommitAborted:
    """Nothing of ``epoch`` is visible anywhere; run the same epoch again."""

    epoch: int
    step: str
    reason: str


@dataclass(frozen=True)
class CommitFatal:
    """The cycle must stop. Whatever is in doubt is resolved by ``start()`` on restart."""

    epoch: int
    step: str
    reason: str


CommitResult = CommitSucceeded | CommitAborted | CommitFatal


@dataclass
class RecoveryReport:
    """What ``start()`` found and did, as numbers and txn ids."""

    generation: int
    committed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    finalized_epochs: list[int] = field(default_factory=list)
    abandoned_epochs: list[int] = field(default_factory=list)
    # Committed epochs that sinks without a durable prepare still lack: the
    # next run_epoch() of that epoch replays its outputs into them.
    replay_needed: dict[int, list[str]] = field(default_factory=dict)


class _StepFailed(Exception):
    """Internal: a step failed; carries whether a retry can fix it."""

    def __init__(self, step: str, reason: str, *, fatal: bool, definite: bool = True) -> None:
        super().__init__(reason)
        self.step, self.reason, self.fatal = step, reason, fatal
        # definite: we know the step did not take effect (an outcome, or a
        # rejection); otherwise an exception left its effect unknown.
        self.definite = definite


class CommitCycle:
    """Runs epochs through every sink with two-phase commit.

    The order is fixed here and nowhere else (as in Flink's
    TwoPhaseCommitSinkFunction): begin, stage, record progress, prepare,
    commit progress, commit, finalize. Sinks own only their steps.

    The commit point is "commit progress": before it, any failure aborts the
    epoch everywhere; after it, the epoch must reach every sink, by retrying
    the idempotent sink commit now or by ``start()`` after a restart.
    """

    def __init__(
        self,
        pipeline: str,
        sinks: Sequence[TwoPhaseSink],
        progress: ProgressLog,
        *,
        metrics: Metrics | None = None,
        faults: FaultPlan | None = None,
        commit_attempts: int = 3,
    ) -> None:
        self.pipeline = validate_name("pipeline", pipeline)
        if not sinks:
            raise ConfigurationError(f"pipeline {pipeline!r} declares no sinks")
        names: list[str] = []
        for sink in sinks:
            if not isinstance(sink, TwoPhaseSink):
                raise ConfigurationError(
                    f"pipeline {pipeline!r}: {sink!r} does not implement the TwoPhaseSink protocol"
                )
            name = validate_name("sink", sink.name)
            if name in names:
                raise ConfigurationError(f"pipeline {pipeline!r} declares sink {name!r} twice")
            names.append(name)
        if commit_attempts < 1:
            raise ConfigurationError(f"commit_attempts must be >= 1, got {commit_attempts}")
        self.sinks: dict[str, TwoPhaseSink] = dict(zip(names, sinks, strict=True))
        self.progress = progress
        self.metrics: Metrics = metrics or NullMetrics()
        self.faults = faults or FaultPlan()
        self.commit_attempts = commit_attempts
        self.generation: int | None = None

    # ------------------------------------------------------------------ start

    def start(self) -> RecoveryReport:
        """Claim a new writer generation and resolve every stranded txn.

        Raises:
            OutcomeUnknownError: a stranded txn whose epoch the progress log no
                longer knows; it names the txn. Every decidable txn is resolved first.
            FatalError: a sink cannot list or resolve its stranded txns.
        """
        with timed(self.metrics, "cycle.start"):
            # Bind before claiming: a sink that cannot be reached, or whose target
            # is unusable, fails here without burning a writer generation.
            writer = WriterIdentity(self.pipeline, self.progress.log_id)
            for name, sink in self.sinks.items():
                try:
                    bind_writer(sink, writer)
                except ReconcileError:
                    raise
                except Exception as exc:
                    raise RetryableError(
                        f"pipeline {self.pipeline!r}: bind() of sink {name!r} failed: {exc!r}",
                        sink=name,
                    ) from exc
            # Claiming next fences any zombie of ours before we look at what it left.
            self.generation = generation = self.progress.claim_generation()
            report = RecoveryReport(generation)
            unknown: list[str] = []
            for name, sink in self.sinks.items():
                try:
                    stranded = list(sink.recover())
                except ReconcileError as exc:
                    raise FatalError(f"recover() of sink {name!r} failed: {exc}") from exc
                except Exception as exc:
                    raise FatalError(f"recover() of sink {name!r} failed: {exc!r}") from exc
                for txn in stranded:
                    if not isinstance(txn, SinkTxnId):
                        raise ContractViolationError(
                            f"recover() of sink {name!r} returned {txn!r}; it must return "
                            "SinkTxnId values",
                            sink=name,
                        )
                    if txn.pipeline != self.pipeline or txn.sink != name:
                        continue  # another pipeline's txn: not ours to decide
                    status = self.progress.status(txn.epoch)
                    # The decision for a txn that is prepared but not committed:
                    # - COMMITTED/FINALIZED: the commit point was passed, so the
                    #   epoch must reach this sink: commit it.
                    # - ABORTED, DECIDED or never recorded: the commit point was
                    #   not passed, so no sink may keep it: abort it.
                    # - UNKNOWN (the log was truncated past it): never guess;
                    #   pull-and-diff decides (a later issue). Report it.
                    if status in (EpochStatus.COMMITTED, EpochStatus.FINALIZED):
                        self._settle(sink, "commit", txn)
                        report.committed.append(str(txn))
                    elif status is EpochStatus.UNKNOWN:
                        unknown.append(str(txn))
                    else:
                        self._settle(sink, "abort", txn)
                        report.aborted.append(str(txn))
            # Epochs that were decided but never reached the commit point are dead.
            for epoch in self.progress.epochs_in(EpochStatus.DECIDED):
                self.progress.mark(epoch, EpochStatus.ABORTED, generation)
                report.abandoned_epochs.append(epoch)
            # Epochs past the commit point but not finalized: every sink must
            # hold them now. Do not assume it from recover() (a sink that lost
            # or never listed a prepared txn would make us finalize a hole):
            # commit each one again. That is a no-op where the epoch is in the
            # sink, and not OK where it is neither committed nor prepared, which
            # stops here with an error instead of silently losing the epoch.
            # A sink without a durable prepare (its open txn died with the old
            # process) may lack the epoch with nothing to commit: that is
            # expected, and the epoch stays COMMITTED until run_epoch() replays
            # its outputs into that sink.
            for epoch in self.progress.epochs_in(EpochStatus.COMMITTED):
                lacking = []
                for name, sink in self.sinks.items():
                    txn = SinkTxnId(self.pipeline, name, epoch, generation)
                    if has_durable_prepare(sink):
                        self._settle(sink, "commit", txn)
                    elif not isinstance(self._try(sink, "commit", txn), Ok):
                        lacking.append(name)
                if lacking:
                    report.replay_needed[epoch] = lacking
                    continue
                self.progress.mark(epoch, EpochStatus.FINALIZED, generation)
                report.finalized_epochs.append(epoch)
            self.metrics.count("recovery.committed", len(report.committed))
            self.metrics.count("recovery.aborted", len(report.aborted))
            if unknown:
                self.metrics.count("recovery.unknown", len(unknown))
                raise OutcomeUnknownError(
                    f"pipeline {self.pipeline!r}: the progress log no longer knows the "
                    f"epochs of stranded txns {unknown}; they were left prepared. "
                    "Resolve them with pull-and-diff recovery (reconcile repair).",
                    txns=unknown,
                )
            log.info("start: generation %d, %s", generation, report)
            return report

    def _try(self, sink: TwoPhaseSink, operation: str, txn: SinkTxnId) -> SinkOutcome:
        """Run an idempotent txn operation, retrying Retryable outcomes and exceptions."""
        outcome: SinkOutcome = Retryable("not tried")
        for _ in range(self.commit_attempts):
            try:
                outcome = check_outcome(sink.name, operation, txn, getattr(sink, operation)(txn))
            except (ContractViolationError, OutcomeUnknownError):
                # A sink that says it cannot tell (I4) is not retried into a
                # guess, nor replayed over: the error reaches the operator.
                raise
            except Exception as exc:
                outcome = Retryable(repr(exc))
            if isinstance(outcome, Ok | Fatal):
                break
            self.metrics.count(f"sink.{operation}.retryable")
        return outcome

    def _settle(self, sink: TwoPhaseSink, operation: str, txn: SinkTxnId) -> None:
        """Commit or abort a stranded txn, or raise FatalError naming it."""
        outcome = self._try(sink, operation, txn)
        if not isinstance(outcome, Ok):
            raise FatalError(
                f"recovery could not {operation} stranded txn {txn} in sink {sink.name!r}: "
                f"{outcome}",
                txn=str(txn),
            )

    # ------------------------------------------------------------- run_epoch

    def run_epoch(self, epoch: int, outputs: Mapping[str, Iterable[Any]]) -> CommitResult:
        """Run one epoch through the whole cycle.

        Args:
            epoch: the epoch number; must not go below the newest committed epoch.
                Running the newest committed epoch again is a no-op (replay).
            outputs: rows per sink name. A declared sink without rows commits an
                empty batch, so that every sink holds every epoch.

        Returns:
            CommitSucceeded, CommitAborted (run the same epoch again) or
            CommitFatal (stop; restart and call ``start()``).

        Raises:
            InvalidInputError: the epoch or the outputs are wrong; nothing was staged.
            ContractViolationError: a sink returned something that is not an outcome;
                the epoch was aborted everywhere.
        """
        if self.generation is None:
            raise InvalidInputError("run_epoch() before start(): call start() to recover first")
        generation = self.generation
        self._check_epoch(epoch)
        unknown = sorted(set(outputs) - set(self.sinks))
        if unknown:
            raise UnknownSinkError(
                f"pipeline {self.pipeline!r}, epoch {epoch}: rows addressed to undeclared "
                f"sink(s) {unknown}; declared: {sorted(self.sinks)}. Nothing was staged.",
                sinks=unknown,
            )
        # An epoch left past the commit point by a failed sink commit or
        # finalize in this process must reach every sink before anything else.
        for pending in self.progress.epochs_in(EpochStatus.COMMITTED):
            if pending != epoch:
                done = self._complete(pending, self._txns(pending, generation), generation, None)
                if not isinstance(done, CommitSucceeded):
                    return done
        if not all(has_durable_prepare(s) for s in self.sinks.values()):
            # A sink without a durable prepare may need the outputs a second
            # time (a replay after its open txn died): keep one-shot iterators.
            outputs = {n: list(v) if isinstance(v, Iterator) else v for n, v in outputs.items()}
        txns = self._txns(epoch, generation)
        status = self.progress.status(epoch)
        with timed(self.metrics, "cycle.epoch"):
            if status is EpochStatus.FINALIZED:
                # Replay of the newest committed epoch (Spark re-runs its last
                # batch after a restart): every sink already holds it.
                self.metrics.count("cycle.outcome.replayed")
                return CommitSucceeded(epoch, replayed=True)
            if status is EpochStatus.COMMITTED:
                # Committed in the log, not yet in every sink: finish it. The
                # outputs matter only to a sink without a durable prepare.
                result = self._complete(epoch, txns, generation, outputs)
            else:
                result = self._run(epoch, outputs, txns, generation)
        self.metrics.count(f"cycle.outcome.{type(result).__name__}")
        return result

    def close(self) -> None:
        """Close every sink that has ``close()`` (connections, open txns), as an exit would."""
        for name, sink in self.sinks.items():
            closer = getattr(sink, "close", None)
            if closer is None:
                continue
            try:
                closer()
            except Exception:
                log.exception("closing sink %r failed", name)

    def _txns(self, epoch: int, generation: int) -> dict[str, SinkTxnId]:
        return {n: SinkTxnId(self.pipeline, n, epoch, generation) for n in self.sinks}

    def _check_epoch(self, epoch: int) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise EpochOrderError(
                f"pipeline {self.pipeline!r}: epoch must be an int >= 0, got {epoch!r}"
            )
        last = self.progress.last_committed()
        if last is not None and epoch < last:
            raise EpochOrderError(
                f"pipeline {self.pipeline!r}: epoch {epoch} goes backwards; epoch {last} "
                "is already committed. Nothing was staged.",
                epoch=epoch,
                last_committed=last,
            )

    def _run(
        self,
        epoch: int,
        outputs: Mapping[str, Iterable[Any]],
        txns: dict[str, SinkTxnId],
        generation: int,
    ) -> CommitResult:
        # Failure matrix, before the commit point: begin failing is fatal
        # (restart, resume from the last checkpoint); stage, record progress and
        # prepare failing abort the epoch in every sink and in the log.
        try:
            self._step("begin", lambda: None, fatal=True)
        except _StepFailed as failed:
            return CommitFatal(epoch, failed.step, failed.reason)
        try:
            self._step(
                "stage",
                lambda: self._each_sink("stage", txns, lambda n: (outputs.get(n, ()),)),
            )
            self._step(
                "record_progress",
                lambda: self.progress.mark(epoch, EpochStatus.DECIDED, generation),
            )
            self._step("prepare", lambda: self._each_sink("prepare", txns))
        except (_StepFailed, ContractViolationError) as failed:
            return self._abort(epoch, txns, generation, failed)

        # The commit point. Two ways to fail here:
        # - definite (the write was refused: Retryable, Fatal, fenced): nothing
        #   is committed, so abort the epoch everywhere, as before it;
        # - ambiguous (an exception: we cannot tell whether the entry is
        #   durable): we must NOT abort the sinks, since the log may say
        #   committed. The prepared txns stay; start() on restart reads the
        #   log and commits or aborts them.
        try:
            self._step(
                "commit_progress",
                lambda: self.progress.mark(epoch, EpochStatus.COMMITTED, generation),
            )
        except _StepFailed as failed:
            if failed.definite:
                return self._abort(epoch, txns, generation, failed)
            return CommitFatal(epoch, failed.step, failed.reason)

        return self._complete(epoch, txns, generation, outputs)

    def _complete(
        self,
        epoch: int,
        txns: dict[str, SinkTxnId],
        generation: int,
        outputs: Mapping[str, Iterable[Any]] | None,
    ) -> CommitResult:
        """Take an epoch that passed the commit point into every sink, then finalize it."""
        # Past the commit point: sink commits are idempotent, so retry them.
        # If a sink still cannot commit, stop; start() commits it on restart.
        try:
            self._step("commit", lambda: self._commit_sinks(epoch, txns, outputs), fatal=True)
        except _StepFailed as failed:
            return CommitFatal(epoch, failed.step, failed.reason)

        # Finalize is bookkeeping: the epoch is already in every sink. If it
        # fails, start() (or the next run_epoch) finalizes it; the epoch succeeded.
        try:
            self._step(
                "finalize",
                lambda: self.progress.mark(epoch, EpochStatus.FINALIZED, generation),
            )
        except _StepFailed as failed:
            log.warning("epoch %d committed but not finalized: %s", epoch, failed.reason)
            self.metrics.count("cycle.finalize_failed")
            return CommitSucceeded(epoch, finalized=False)
        return CommitSucceeded(epoch)

    def _step(self, step: str, action: Any, *, fatal: bool = False) -> None:
        """Run one cycle step under its fault point and timer; map failures to _StepFailed."""
        with timed(self.metrics, f"cycle.step.{step}"):
            try:
                injected = self.faults.hit(f"cycle.{step}")
                if isinstance(injected, Retryable | Fatal):
                    raise _StepFailed(
                        step, injected.reason, fatal=fatal or isinstance(injected, Fatal)
                    )
                action()
                self.faults.hit(f"cycle.{step}", "after")
            except (_StepFailed, ContractViolationError):
                raise
            except FencedError as exc:
                # A zombie must stop, whatever step it was in.
                raise _StepFailed(step, str(exc), fatal=True) from exc
            except Exception as exc:
                raise _StepFailed(
                    step, f"{type(exc).__name__}: {exc}", fatal=fatal, definite=False
                ) from exc

    def _commit_sinks(
        self,
        epoch: int,
        txns: dict[str, SinkTxnId],
        outputs: Mapping[str, Iterable[Any]] | None,
    ) -> None:
        """Commit ``epoch`` in every sink, replaying it where a prepare was not durable."""
        for name, sink in self.sinks.items():
            txn = txns[name]
            outcome = self._try(sink, "commit", txn)
            if isinstance(outcome, Ok):
                continue
            if has_durable_prepare(sink):
                # A durable prepare that will not commit: stop; start() retries it.
                raise _StepFailed("commit", f"sink {name!r} commit({txn}): {outcome}", fatal=True)
            # The sink's open txn is gone (a dropped connection, an aborted
            # ambiguous COMMIT, a restart) and the epoch is not in it, while the
            # log says the epoch committed: replay its outputs into this sink.
            # Its commit marker makes the replay exactly-once.
            if outputs is None:
                raise _StepFailed(
                    "commit",
                    f"epoch {epoch} is committed but sink {name!r} lacks it and cannot keep a "
                    f"prepared txn across restarts: run_epoch({epoch}, outputs) to replay it",
                    fatal=True,
                )
            self.metrics.count("sink.commit.replayed")
            for operation, args in (("stage", (outputs.get(name, ()),)), ("prepare", ())):
                step = check_outcome(name, operation, txn, getattr(sink, operation)(txn, *args))
                if not isinstance(step, Ok):
                    raise _StepFailed(
                        "commit",
                        f"replay of {txn} into sink {name!r}: {operation}: {step}",
                        fatal=True,
                    )
            outcome = self._try(sink, "commit", txn)
            if not isinstance(outcome, Ok):
                raise _StepFailed(
                    "commit", f"replay of {txn} into sink {name!r}: commit: {outcome}", fatal=True
                )

    def _each_sink(
        self, operation: str, txns: dict[str, SinkTxnId], args: Any = lambda name: ()
    ) -> None:
        """Run stage or prepare on every sink; raise _StepFailed on the first failure."""
        for name, sink in self.sinks.items():
            txn = txns[name]
            try:
                value = getattr(sink, operation)(txn, *args(name))
            except Exception as exc:
                # Before the commit point an unknown outcome is harmless: the
                # epoch is aborted everywhere, and abort is idempotent.
                value = Retryable(f"{type(exc).__name__}: {exc}")
            outcome = check_outcome(name, operation, txn, value)
            if not isinstance(outcome, Ok):
                raise _StepFailed(
                    operation,
                    f"sink {name!r} {operation}({txn}): {outcome}",
                    fatal=isinstance(outcome, Fatal),
                )

    def _abort(
        self,
        epoch: int,
        txns: dict[str, SinkTxnId],
        generation: int,
        failed: _StepFailed | ContractViolationError,
    ) -> CommitResult:
        """Abort the epoch in every sink and the log; never hide the first error."""
        for name, sink in self.sinks.items():
            try:
                outcome = sink.abort(txns[name])
                if not isinstance(outcome, Ok):
                    log.warning("abort of %s in sink %r: %s", txns[name], name, outcome)
            except Exception:
                # A failed abort leaves a prepared txn at worst; start() aborts
                # it on restart, since the log never says it committed.
                log.exception("abort of %s in sink %r failed", txns[name], name)
        try:
            if self.progress.status(epoch) is EpochStatus.DECIDED:
                self.progress.mark(epoch, EpochStatus.ABORTED, generation)
        except Exception:
            log.exception("could not record epoch %d as aborted", epoch)
        if isinstance(failed, ContractViolationError):
            raise failed
        if failed.fatal:
            return CommitFatal(epoch, failed.step, failed.reason)
        return CommitAborted(epoch, failed.step, failed.reason)
