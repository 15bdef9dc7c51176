"""The commit cycle: the coordinator that owns the order of every epoch's 2PC steps."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
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
    SinkTxnId,
    UnknownSinkError,
    WriterIdentity,
    validate_name,
)
from reconcile.decisions import Settle, decide_stranded, is_terminal
from reconcile.faults import FaultPlan
from reconcile.logs import within_cycle
from reconcile.metrics import Metrics, record_result, record_started, timed, with_labels
from reconcile.progress import EpochStatus, ProgressLog
from reconcile.progress_file import FileProgressLog
from reconcile.results import (
    CommitAborted,
    CommitFatal,
    CommitResult,
    CommitSucceeded,
    RecoveryReport,
)
from reconcile.sink import TwoPhaseSink, bind_writer, has_durable_prepare
from reconcile.steps import SinkSteps, StepFailed

__all__ = [
    "CommitAborted",
    "CommitCycle",
    "CommitFatal",
    "CommitResult",
    "CommitSucceeded",
    "RecoveryReport",
]

log = logging.getLogger("reconcile.cycle")

_SINK_MEMBERS = ("name", "stage", "prepare", "commit", "abort", "recover")
_LOG_MEMBERS = ("log_id", "claim_generation", "mark", "status", "last_committed", "epochs_in")


def _missing(value: object, members: Sequence[str]) -> list[str]:
    return [m for m in members if not hasattr(value, m)]


class CommitCycle:
    """Runs epochs through every sink with two-phase commit.

    The order is fixed here and nowhere else (as in Flink's
    TwoPhaseCommitSinkFunction): begin, stage, record progress, prepare,
    commit progress, commit, finalize. Sinks own only their steps.

    The commit point is "commit progress": before it, any failure aborts the
    epoch everywhere; after it, the epoch must reach every sink, by retrying
    the idempotent sink commit now or by ``start()`` after a restart.

    Args:
        pipeline: the pipeline's name ([A-Za-z0-9_]{1,63}); sinks learn it from
            ``start()``, so it is given only here.
        sinks: the TwoPhaseSink of every output, with distinct names.
        progress: the durable progress log, or a folder for a FileProgressLog.
        metrics: where counters and step timings go.
        faults: a fault plan (tests and chaos runs).
        commit_attempts: how often an idempotent sink operation is tried in a row.
    """

    def __init__(
        self,
        pipeline: str,
        sinks: Sequence[TwoPhaseSink],
        progress: ProgressLog | str | os.PathLike[str],
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
            missing = _missing(sink, _SINK_MEMBERS)
            if missing:
                raise ConfigurationError(
                    f"pipeline {pipeline!r}: {sink!r} is not a TwoPhaseSink: it lacks "
                    f"{', '.join(missing)}"
                )
            name = validate_name("sink", sink.name)
            if name in names:
                raise ConfigurationError(f"pipeline {pipeline!r} declares sink {name!r} twice")
            names.append(name)
        if commit_attempts < 1:
            raise ConfigurationError(f"commit_attempts must be >= 1, got {commit_attempts}")
        if isinstance(progress, str | os.PathLike):
            progress = FileProgressLog(progress, pipeline)
        missing = _missing(progress, _LOG_MEMBERS)
        if missing:
            raise ConfigurationError(
                f"pipeline {pipeline!r}: {type(progress).__name__} is not a progress log: it "
                f"lacks {', '.join(missing)} (pass a FileProgressLog, a MemoryProgressLog, "
                "or a folder)"
            )
        self.sinks: dict[str, TwoPhaseSink] = dict(zip(names, sinks, strict=True))
        self.progress: ProgressLog = progress
        self.metrics: Metrics = with_labels(metrics, pipeline=self.pipeline)
        self.faults = faults or FaultPlan()
        self.commit_attempts = commit_attempts
        self.generation: int | None = None
        self._steps = SinkSteps(self.sinks, self.metrics, commit_attempts)

    # ------------------------------------------------------------------ start

    @within_cycle
    def start(self) -> RecoveryReport:
        """Claim a writer generation and resolve every stranded txn.

        Every sink is bound first (``bind``: connect, check the target), so an
        unreachable or misconfigured sink fails before a generation is claimed.
        Calling ``start()`` again on the same cycle (after a retryable failure)
        keeps the generation it claimed: it is the same writer.

        Raises:
            ConfigurationError: a sink's target is unusable (no retry can help).
            RetryableError: a sink cannot be reached now, or cannot list its
                stranded txns now; retry later.
            OutcomeUnknownError: a stranded txn whose epoch the progress log no
                longer knows; it names the txn. Every decidable txn is resolved first.
            FatalError: a sink cannot resolve a stranded txn.
        """
        with timed(self.metrics, "cycle.start"):
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
            if self.generation is None:
                # Claiming fences any zombie of ours before we look at what it left.
                self.generation = self.progress.claim_generation()
            generation = self.generation
            report = RecoveryReport(generation)
            unknown = self._settle_stranded(report)
            # Epochs that were decided but never reached the commit point are dead.
            for epoch in self.progress.epochs_in(EpochStatus.DECIDED):
                self.progress.mark(epoch, EpochStatus.ABORTED, generation)
                report.abandoned_epochs.append(epoch)
            self._finish_committed(report)
            self.metrics.count("recovery.committed", len(report.committed))
            self.metrics.count("recovery.aborted", len(report.aborted))
            record_started(self.metrics, self.progress.last_committed())
            if unknown:
                self.metrics.count("recovery.unknown", len(unknown))
                raise OutcomeUnknownError(
                    f"pipeline {self.pipeline!r}: the progress log no longer knows the "
                    f"epochs of stranded txns {unknown}; they were left prepared. "
                    "Resolve them with pull-and-diff recovery (reconcile repair).",
                    txns=unknown,
                )
            log.info(
                "pipeline %s: started as generation %d (committed %d, aborted %d stranded txns; "
                "finalized %s; replay needed %s)",
                self.pipeline,
                generation,
                len(report.committed),
                len(report.aborted),
                report.finalized_epochs,
                sorted(report.replay_needed),
            )
            return report

    def _settle_stranded(self, report: RecoveryReport) -> list[str]:
        """Commit or abort every txn a sink holds prepared; return those never guessed."""
        unknown: list[str] = []
        for name, sink in self.sinks.items():
            try:
                stranded = list(sink.recover())
            except ReconcileError as exc:
                kind = RetryableError if isinstance(exc, RetryableError) else FatalError
                raise kind(f"recover() of sink {name!r} failed: {exc}", sink=name) from exc
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
                decision = decide_stranded(self.progress.status(txn.epoch))
                if decision is Settle.COMMIT:
                    self._steps.settle(sink, "commit", txn)
                    report.committed.append(str(txn))
                elif decision is Settle.ABORT:
                    self._steps.settle(sink, "abort", txn)
                    report.aborted.append(str(txn))
                else:
                    unknown.append(str(txn))
        return unknown

    def _finish_committed(self, report: RecoveryReport) -> None:
        """Take every epoch that is past the commit point but not finalized into every sink.

        recover() is not trusted to have listed them (a sink that lost or never
        listed a prepared txn would make us finalize a hole): each one is
        committed again, which is a no-op where the epoch is in the sink, and
        not OK where it is neither committed nor prepared, which stops here with
        an error instead of silently losing the epoch. A sink without a durable
        prepare (its open txn died with the old process) may lack the epoch with
        nothing to commit: that is expected, and the epoch stays COMMITTED until
        run_epoch() replays its outputs into that sink.
        """
        generation = report.generation
        for epoch in self.progress.epochs_in(EpochStatus.COMMITTED):
            lacking = []
            for name, sink in self.sinks.items():
                txn = SinkTxnId(self.pipeline, name, epoch, generation)
                if has_durable_prepare(sink):
                    # Not a stranded txn: the epoch passed the commit point, and this
                    # commit (under the new generation) makes sure the sink holds it.
                    self._steps.settle(sink, "commit", txn, what="committed epoch")
                    continue
                outcome = self._steps.try_op(sink, "commit", txn)
                if isinstance(outcome, Fatal) and outcome.error and is_terminal(outcome.error):
                    raise outcome.error  # e.g. a marker of another state: never "lacking"
                if not isinstance(outcome, Ok):
                    lacking.append(name)
            if lacking:
                report.replay_needed[epoch] = lacking
                continue
            self.progress.mark(epoch, EpochStatus.FINALIZED, generation)
            report.finalized_epochs.append(epoch)

    # ------------------------------------------------------------- run_epoch

    @within_cycle
    def run_epoch(self, epoch: int, outputs: Mapping[str, Iterable[Any]]) -> CommitResult:
        """Run one epoch through the whole cycle.

        Args:
            epoch: the epoch number; must not go below the newest committed epoch
                (except to finish an epoch that is committed but not in every sink).
                Running the newest committed epoch again is a no-op (replay).
            outputs: rows per sink name. A declared sink without rows commits an
                empty batch, so that every sink holds every epoch.

        Returns:
            CommitSucceeded, CommitAborted (run the same epoch again) or
            CommitFatal (stop; if ``restart``, restart and call ``start()``).

        Raises:
            InvalidInputError: the epoch or the outputs are wrong; nothing was staged.
            ContractViolationError: a sink returned something that is not an outcome;
                the epoch was aborted everywhere.
        """
        if self.generation is None:
            raise InvalidInputError("run_epoch() before start(): call start() to recover first")
        generation = self.generation
        status = self._check_epoch(epoch)
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
            if pending < epoch:
                done = self._complete(pending, self._txns(pending, generation), generation, None)
                if not isinstance(done, CommitSucceeded):
                    return done
        if not all(has_durable_prepare(s) for s in self.sinks.values()):
            # A sink without a durable prepare may need the outputs a second
            # time (a replay after its open txn died): keep one-shot iterators.
            outputs = {n: list(v) if isinstance(v, Iterator) else v for n, v in outputs.items()}
        txns = self._txns(epoch, generation)
        began = time.perf_counter()
        with timed(self.metrics, "cycle.epoch"):
            if status is EpochStatus.FINALIZED:
                # Replay of the newest committed epoch (Spark re-runs its last
                # batch after a restart): every sink already holds it.
                result: CommitResult = CommitSucceeded(epoch, replayed=True)
            elif status is EpochStatus.COMMITTED:
                # Committed in the log, not yet in every sink: finish it. The
                # outputs matter only to a sink without a durable prepare.
                result = self._complete(epoch, txns, generation, outputs)
            else:
                result = self._run(epoch, outputs, txns, generation)
        record_result(self.metrics, result)
        self._log_result(result, outputs, time.perf_counter() - began)
        return result

    def _log_result(
        self, result: CommitResult, outputs: Mapping[str, Iterable[Any]], seconds: float
    ) -> None:
        rows = sum(len(v) for v in outputs.values() if isinstance(v, Sequence))
        ms = seconds * 1000
        if isinstance(result, CommitSucceeded):
            what = "replayed (already in)" if result.replayed else "committed"
            log.info(
                "pipeline %s epoch %d %s: %d rows, %.1f ms, generation %s",
                self.pipeline,
                result.epoch,
                what,
                rows,
                ms,
                self.generation,
            )
        else:
            level = logging.WARNING if isinstance(result, CommitAborted) else logging.ERROR
            log.log(
                level,
                "pipeline %s epoch %d %s at %s: %s (%.1f ms)",
                self.pipeline,
                result.epoch,
                "aborted" if isinstance(result, CommitAborted) else "FATAL",
                result.step,
                result.reason,
                ms,
            )

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

    def _check_epoch(self, epoch: int) -> EpochStatus | None:
        """The epoch's status; raise EpochOrderError if running it would go backwards."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise EpochOrderError(
                f"pipeline {self.pipeline!r}: epoch must be an int >= 0, got {epoch!r}"
            )
        status = self.progress.status(epoch)
        last = self.progress.last_committed()
        if last is not None and epoch < last and status is not EpochStatus.COMMITTED:
            raise EpochOrderError(
                f"pipeline {self.pipeline!r}: epoch {epoch} goes backwards; epoch {last} "
                "is already committed. Nothing was staged.",
                epoch=epoch,
                last_committed=last,
            )
        return status

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
        except StepFailed as failed:
            return CommitFatal(epoch, failed.step, failed.reason, failed.error, restart=True)
        try:
            self._step(
                "stage",
                lambda: self._steps.each("stage", txns, lambda n: (outputs.get(n, ()),)),
            )
            self._step(
                "record_progress",
                lambda: self.progress.mark(epoch, EpochStatus.DECIDED, generation),
            )
            self._step("prepare", lambda: self._steps.each("prepare", txns))
        except (StepFailed, ContractViolationError) as failed:
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
        except StepFailed as failed:
            if failed.definite:
                return self._abort(epoch, txns, generation, failed)
            return CommitFatal(epoch, failed.step, failed.reason, failed.error, restart=True)

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
        # If a sink still cannot commit, stop; start() commits it on restart,
        # unless the cause is one no restart can cure (a marker of another state).
        try:
            self._step("commit", lambda: self._steps.commit_all(epoch, txns, outputs), fatal=True)
        except StepFailed as failed:
            return CommitFatal(
                epoch,
                failed.step,
                failed.reason,
                failed.error,
                restart=not is_terminal(failed.error),
            )

        # Finalize is bookkeeping: the epoch is already in every sink. If it
        # fails, start() (or the next run_epoch) finalizes it; the epoch succeeded.
        try:
            self._step(
                "finalize",
                lambda: self.progress.mark(epoch, EpochStatus.FINALIZED, generation),
            )
        except StepFailed as failed:
            log.warning("epoch %d committed but not finalized: %s", epoch, failed.reason)
            self.metrics.count("cycle.finalize_failed")
            return CommitSucceeded(epoch, finalized=False)
        return CommitSucceeded(epoch)

    def _step(self, step: str, action: Any, *, fatal: bool = False) -> None:
        """Run one cycle step under its fault point and timer; map failures to StepFailed."""
        with timed(self.metrics, f"cycle.step.{step}"):
            try:
                injected = self.faults.hit(f"cycle.{step}")
                if isinstance(injected, Retryable | Fatal):
                    raise StepFailed(
                        step,
                        injected.reason,
                        fatal=fatal or isinstance(injected, Fatal),
                        error=injected.error,
                    )
                action()
                self.faults.hit(f"cycle.{step}", "after")
            except (StepFailed, ContractViolationError):
                raise
            except (FencedError, InvalidInputError, FatalError) as exc:
                # A definite refusal by the log: a zombie must stop, whatever
                # step it was in; an illegal move is a bug no retry fixes.
                raise StepFailed(step, str(exc), fatal=True, error=exc) from exc
            except RetryableError as exc:
                raise StepFailed(step, str(exc), fatal=fatal, error=exc) from exc
            except Exception as exc:
                raise StepFailed(
                    step, f"{type(exc).__name__}: {exc}", fatal=fatal, definite=False
                ) from exc

    def _abort(
        self,
        epoch: int,
        txns: dict[str, SinkTxnId],
        generation: int,
        failed: StepFailed | ContractViolationError,
    ) -> CommitResult:
        """Abort the epoch in every sink and the log; never hide the first error."""
        self._steps.abort_all(txns)
        try:
            if self.progress.status(epoch) is EpochStatus.DECIDED:
                self.progress.mark(epoch, EpochStatus.ABORTED, generation)
        except Exception:
            log.exception("could not record epoch %d as aborted", epoch)
        if isinstance(failed, ContractViolationError):
            raise failed
        if failed.fatal:
            # Before the commit point a Fatal outcome means what it says: no
            # retry of this epoch can succeed (bad data, a fenced zombie, a
            # marker of another state). Restarting would only repeat it.
            error = failed.error or FatalError(failed.reason)
            return CommitFatal(epoch, failed.step, failed.reason, error, restart=False)
        return CommitAborted(epoch, failed.step, failed.reason, failed.error)
