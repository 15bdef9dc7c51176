"""The commit cycle: the coordinator that owns the order of every epoch's 2PC steps."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from reconcile.core import hooks
from reconcile.core.contract import (
    ConfigurationError,
    ContractViolationError,
    FatalError,
    InvalidInputError,
    SinkTxnId,
    UnknownSinkError,
    validate_name,
)
from reconcile.core.decisions import check_epoch_number, check_epoch_order, is_terminal
from reconcile.core.logs import within_cycle
from reconcile.core.metrics import Metrics, record_result, timed, with_labels
from reconcile.core.progress import EpochStatus, ProgressLog
from reconcile.core.results import (
    CommitAborted,
    CommitFatal,
    CommitResult,
    CommitSucceeded,
    RecoveryReport,
    log_result,
)
from reconcile.core.sink import TwoPhaseSink, check_sinks, has_durable_prepare
from reconcile.engine.expected import ExpectedState
from reconcile.engine.faults import FaultPlan
from reconcile.engine.logic import check_logic
from reconcile.engine.progress_file import open_progress_log
from reconcile.engine.replay import ReplayRows
from reconcile.engine.restart import Restart
from reconcile.engine.schema_plan import hand_schema_change
from reconcile.engine.steps import SinkSteps, StepFailed, failed_at_commit_point, run_step

__all__ = [
    "CommitAborted",
    "CommitCycle",
    "CommitFatal",
    "CommitResult",
    "CommitSucceeded",
    "RecoveryReport",
]

log = logging.getLogger("reconcile.cycle")

# With an expected state: between recording the epoch's outputs in the store and
# the decision (a crash here leaves an undecided epoch for start() to revert),
# and between the decision and the sink commits (a crash here leaves sinks
# behind the store, to be brought to it).
RECORDED = hooks.declare("cycle.expected_state.recorded")
DECIDED = hooks.declare("cycle.decided")


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
        expected_state: the expected state of the keyed sinks (instead of
            ``progress``: its epochs table is then the progress log). See below.
        metrics: where counters and step timings go.
        faults: a fault plan (tests and chaos runs).
        commit_attempts: how often an idempotent sink operation is tried in a row.
        logic_version: the logic this writer runs (``reconcile.engine.logic``).

    With an expected state, the commit point records the epoch's outputs in
    the store (one tokened commit per sink table), THEN writes the decision
    (the epoch is committed) in the store's epochs table, then commits the
    sinks. Why this order, and what recovery does at each point:

    - the outputs are recorded before the decision, so that a decided epoch
      always has its expected state: whatever happens to a sink later, the
      sink can be brought to it (replay of the recorded changes, or
      pull-and-diff), and never to a recomputed run's output;
    - a crash after some tables were recorded but before the decision leaves
      an epoch that no one decided: ``start()`` reverts it in the store and
      aborts it in the sinks; the epoch runs again, possibly with other rows
      (a transform need not be deterministic), nothing of the first run left;
    - a crash after the decision and before a sink's commit leaves a sink
      behind the store: a sink with a durable prepare commits its prepared txn
      (the same run's rows); a sink without one (an open Postgres transaction
      that died) is given the RECORDED changes of that epoch: the run that
      reached the decision wins, always.
    """

    def __init__(
        self,
        pipeline: str,
        sinks: Sequence[TwoPhaseSink],
        progress: ProgressLog | str | os.PathLike[str] | None = None,
        *,
        expected_state: ExpectedState | None = None,
        metrics: Metrics | None = None,
        faults: FaultPlan | None = None,
        commit_attempts: int = 3,
        logic_version: str | None = None,
    ) -> None:
        self.pipeline = validate_name("pipeline", pipeline)
        if not sinks:
            raise ConfigurationError(f"pipeline {pipeline!r} declares no sinks")
        names = check_sinks(pipeline, sinks)
        if commit_attempts < 1:
            raise ConfigurationError(f"commit_attempts must be >= 1, got {commit_attempts}")
        if expected_state is not None:
            expected_state.check_sinks(names)
        self.sinks: dict[str, TwoPhaseSink] = dict(zip(names, sinks, strict=True))
        self.progress: ProgressLog = open_progress_log(
            pipeline, progress, expected_state.progress if expected_state is not None else None
        )
        self.expected_state = expected_state
        self.metrics: Metrics = with_labels(metrics, pipeline=self.pipeline)
        self.faults = faults or FaultPlan()
        self.commit_attempts = commit_attempts
        self.generation: int | None = None
        # A rebuild sets ``rebuilding``: it may start on the mix its own steps left.
        self.logic_version, self.rebuilding = logic_version, False
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
            ConfigurationError: a sink's target is unusable (no retry can help),
                or the expected state cannot hold every value of a sink's table, or
                a rebuild is unfinished or ran another logic (``check_logic``).
            RetryableError: a sink cannot be reached now, or cannot list its
                stranded txns now; retry later.
            OutcomeUnknownError: a stranded txn whose epoch the progress log no
                longer knows, in a sink that pull-and-diff cannot stand in for (no
                expected state, or not pullable); it names the txn. Every decidable
                txn is resolved first.
            FatalError: a sink cannot resolve a stranded txn.
        """
        with timed(self.metrics, "cycle.start"):
            if self.expected_state is not None:
                check_logic(self.expected_state.root, self.pipeline, self.logic_version,
                            self.expected_state.keys, rebuilding=self.rebuilding)  # fmt: skip
            restart = Restart(self.pipeline, self.sinks, self.progress, self._steps,
                              self.metrics, self.expected_state)  # fmt: skip
            restart.bind_sinks()
            if self.expected_state is not None:
                # The store must know the sink tables' types before its first
                # epoch, and an existing store table that cannot hold what a sink
                # table can is refused now, not at a later epoch's commit point.
                self.expected_state.take_sink_types(self.sinks)
            if self.generation is None:
                # Claiming fences any zombie of ours before we look at what it left.
                self.generation = self.progress.claim_generation()
            return restart.run(self.generation)

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
        if self.expected_state is not None or not all(
            has_durable_prepare(s) for s in self.sinks.values()
        ):
            # The expected state reads the outputs beside the sinks, and a sink
            # without a durable prepare may need them a second time (a replay
            # after its open txn died): keep one-shot iterators.
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
        log_result(
            log, self.pipeline, self.generation, result, outputs, time.perf_counter() - began
        )
        if self.expected_state is not None and isinstance(result, CommitSucceeded):
            # After the epoch is visible in every sink, not on its way there, and
            # on the store's own thread: no epoch's latency includes it. It runs
            # while the caller prepares the next epoch (Spark reads and
            # transforms the next micro-batch); the next use of the store waits
            # for it. Keep the store's history from the oldest epoch some sink
            # may still lack.
            lacking = self.progress.epochs_in(EpochStatus.COMMITTED)
            self.expected_state.maintain_in_background(min([epoch, *lacking]), self.metrics)
        return result

    def close(self) -> None:
        """Close every sink that has ``close()`` (connections, open txns), as an exit would.

        Housekeeping of the expected state still running is waited for first.
        """
        if self.expected_state is not None:
            self.expected_state.close()
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
        check_epoch_number(self.pipeline, epoch)
        status = self.progress.status(epoch)
        check_epoch_order(self.pipeline, epoch, status, self.progress.last_committed())
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
            self._step("stage", lambda: self._stage(epoch, outputs, txns))
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
            self._step("commit_progress", lambda: self._decide(epoch, outputs, generation))
        except StepFailed as failed:
            if failed.definite:
                return self._abort(epoch, txns, generation, failed)
            return CommitFatal(epoch, failed.step, failed.reason, failed.error, restart=True)

        return self._complete(epoch, txns, generation, outputs)

    def _stage(
        self, epoch: int, outputs: Mapping[str, Iterable[Any]], txns: dict[str, SinkTxnId]
    ) -> None:
        """Stage the epoch: into the expected state's types first, then into every sink.

        The store's conversion comes first so that a value it cannot hold is
        refused here, before any sink holds the epoch and before anything is
        decided (an InvalidInputError: the epoch stops, nothing was written).
        """
        if self.expected_state is not None:
            changes = self.expected_state.stage(epoch, outputs)
            # A schema change is handed to its sink before the sink stages the
            # rows that carry it; the sink makes it in its epoch txn, after its
            # fence check (a sink that cannot refuses here: nothing is written).
            for name, change in changes.items():
                hand_schema_change(self.sinks[name], name, change)
        self._steps.each("stage", txns, lambda n: (outputs.get(n, ()),))

    def _decide(self, epoch: int, outputs: Mapping[str, Iterable[Any]], generation: int) -> None:
        """The commit point: record the expected state (if any), then the decision."""
        if self.expected_state is not None:
            self.expected_state.record(epoch, outputs)
            hooks.point(RECORDED)
        self.progress.mark(epoch, EpochStatus.COMMITTED, generation)
        hooks.point(DECIDED)

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
            replay = (
                outputs
                if self.expected_state is None
                else ReplayRows(self.expected_state, epoch, outputs)
            )
            self._step("commit", lambda: self._steps.commit_all(epoch, txns, replay), fatal=True)
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

    def _step(self, step: str, action: Callable[[], object], *, fatal: bool = False) -> None:
        run_step(self.faults, self.metrics, step, action, fatal=fatal)

    def _abort(
        self,
        epoch: int,
        txns: dict[str, SinkTxnId],
        generation: int,
        failed: StepFailed | ContractViolationError,
    ) -> CommitResult:
        """Abort the epoch in every sink and the log; never hide the first error."""
        self._steps.abort_all(txns)
        if self.expected_state is not None:
            self.expected_state.discard_staged()
        if self.expected_state is not None and failed_at_commit_point(failed):
            # The decision was refused: what was recorded for the epoch must go,
            # or a re-run would be taken as recorded. If this fails, start()
            # reverts it (the epoch is undecided either way).
            try:
                self.expected_state.revert_undecided(self.progress.last_committed())
            except Exception:
                log.exception("could not revert epoch %d in the expected state", epoch)
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
