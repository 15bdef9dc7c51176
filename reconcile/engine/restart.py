"""What ``CommitCycle.start()`` does after a restart: settle stranded txns, finish epochs."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from reconcile.core.contract import (
    ContractViolationError,
    Fatal,
    FatalError,
    Ok,
    OutcomeUnknownError,
    ReconcileError,
    RetryableError,
    SinkTxnId,
    WriterIdentity,
)
from reconcile.core.decisions import Settle, decide_stranded, deterministic_error, is_terminal
from reconcile.core.metrics import Metrics, record_started
from reconcile.core.progress import EpochStatus, ProgressLog
from reconcile.core.results import RecoveryReport
from reconcile.core.sink import TwoPhaseSink, bind_writer, capabilities_of, has_durable_prepare
from reconcile.engine.decided import ProgressDecisions
from reconcile.engine.expected import ExpectedState
from reconcile.engine.replay import ReplayRows
from reconcile.engine.steps import SinkSteps
from reconcile.recovery.api import recover_sink
from reconcile.recovery.modes import Mode

__all__ = ["Restart"]

log = logging.getLogger("reconcile.cycle")


class Restart:
    """The recovery steps of ``start()``, over one pipeline's sinks and progress log."""

    def __init__(
        self,
        pipeline: str,
        sinks: Mapping[str, TwoPhaseSink],
        progress: ProgressLog,
        steps: SinkSteps,
        metrics: Metrics,
        expected_state: ExpectedState | None = None,
    ) -> None:
        self.pipeline, self.sinks, self.progress, self._steps = pipeline, sinks, progress, steps
        self.metrics = metrics
        self.expected_state = expected_state

    def bind_sinks(self) -> None:
        """Bind every sink to the writer (before a generation is claimed).

        An unreachable or unusable sink fails here, without burning a generation.

        Raises:
            ConfigurationError: a sink's target is unusable (from the sink).
            DeterministicError: a sink's bind() raised an error that is the same
                on every attempt (``reconcile.core.decisions.DETERMINISTIC``).
            RetryableError: a sink cannot be reached now.
        """
        # The sinks hold every record they find to what the progress log
        # decided (reconcile.core.claims), read from it when they ask.
        writer = WriterIdentity(
            self.pipeline, self.progress.log_id, decisions=ProgressDecisions(self.progress)
        )
        for name, sink in self.sinks.items():
            try:
                bind_writer(sink, writer)
            except ReconcileError:
                raise
            except Exception as exc:
                where = f"pipeline {self.pipeline!r}: bind() of sink {name!r}"
                same_again = deterministic_error(exc, where)
                if same_again is not None:
                    raise same_again from exc
                raise RetryableError(
                    f"pipeline {self.pipeline!r}: bind() of sink {name!r} failed: {exc!r}",
                    sink=name,
                ) from exc

    def run(self, generation: int) -> RecoveryReport:
        """Settle what a previous writer left, as writer ``generation``.

        Raises:
            OutcomeUnknownError: a stranded txn whose epoch the progress log no
                longer knows, in a sink that pull-and-diff cannot stand in for; it
                names the txn. Every decidable txn is resolved first.
            FatalError, RetryableError: a sink cannot list or resolve its txns.
        """
        report = RecoveryReport(generation)
        if self.expected_state is not None:
            # The store's tables are written by this generation from now on, and
            # an epoch recorded in some of them but never decided is undone: it
            # runs again, and nothing of the run that did not reach the decision
            # may stay (a re-run may compute other rows).
            self.expected_state.claim(generation)
            decided = self.progress.last_committed()
            for sink, epoch in self.expected_state.revert_undecided(decided):
                log.info("pipeline %s: epoch %d of %s was never decided: reverted in the "
                         "expected state", self.pipeline, epoch, sink)  # fmt: skip
        unknown = self.settle_stranded(report)
        repair = self.abort_for_pull_and_diff(unknown, report)
        unknown = [t for t in unknown if t.sink not in repair]
        # Epochs that were decided but never reached the commit point are dead.
        for epoch in self.progress.epochs_in(EpochStatus.DECIDED):
            self.progress.mark(epoch, EpochStatus.ABORTED, generation)
            report.abandoned_epochs.append(epoch)
        self.finish_committed(report)
        self.pull_and_diff(repair, report)
        self.metrics.count("recovery.committed", len(report.committed))
        self.metrics.count("recovery.aborted", len(report.aborted))
        record_started(self.metrics, self.progress.last_committed())
        if unknown:
            self.metrics.count("recovery.unknown", len(unknown))
            names = [str(t) for t in unknown]
            raise OutcomeUnknownError(
                f"pipeline {self.pipeline!r}: the progress log no longer knows the "
                f"epochs of stranded txns {names}; they were left prepared. "
                "Roll them back by hand, then bring the sink to its expected state "
                "with pull-and-diff recovery (reconcile repair, or recover_sink()).",
                txns=names,
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

    def settle_stranded(self, report: RecoveryReport) -> list[SinkTxnId]:
        """Commit or abort every txn a sink holds prepared; return those never guessed."""
        unknown: list[SinkTxnId] = []
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
                    unknown.append(txn)
        return unknown

    def abort_for_pull_and_diff(self, unknown: list[SinkTxnId], report: RecoveryReport) -> set[str]:
        """Abort the stranded txns the log no longer knows, where pull-and-diff can stand in.

        The log cannot say whether such a txn's epoch passed the commit point,
        so neither committing nor aborting it can be decided from the log. With
        an expected state, it need not be: the store holds what the sink must
        hold at the newest decided epoch. Aborting the txn loses nothing that
        pull-and-diff does not restore (``pull_and_diff``, after the committed
        epochs are finished), and committing could add rows of a run the store
        does not hold. A sink that cannot be pulled from, or has no store
        table, keeps its txn prepared and is reported as before.

        Returns:
            The sinks to bring to the expected state.
        """
        if self.expected_state is None:
            return set()
        repair: set[str] = set()
        for txn in unknown:
            sink = self.sinks[txn.sink]
            if txn.sink not in self.expected_state.tables or not capabilities_of(sink).pullable:
                continue
            log.warning("pipeline %s: stranded txn %s is of an epoch the progress log no longer "
                        "knows: rolled back, the sink is brought to its expected state by "
                        "pull-and-diff", self.pipeline, txn)  # fmt: skip
            self._steps.settle(sink, "abort", txn)
            report.aborted.append(str(txn))
            repair.add(txn.sink)
        return repair

    def pull_and_diff(self, names: set[str], report: RecoveryReport) -> None:
        """Bring each of these sinks to the store's state at the newest committed epoch."""
        target = self.progress.last_committed()
        if not names or target is None or self.expected_state is None:
            return

        for name in sorted(names):
            # Full mode: the txn's epoch is older than anything the log keeps, so
            # its rows may be anywhere before the sink's newest marker, where
            # scoped mode does not look. A rare path: correctness over speed.
            found = recover_sink(
                self.sinks[name],
                self.expected_state.tables[name],
                report.generation,
                mode=Mode.FULL,
                target_epoch=target,
            )
            report.repaired[name] = found.applied
            log.info("pipeline %s: sink %s brought to epoch %d by pull-and-diff (%s mode): "
                     "%d missing, %d extra, %d changed, %d applied", self.pipeline, name, target,
                     found.mode, found.missing, found.extra, found.changed,
                     found.applied)  # fmt: skip

    def finish_committed(self, report: RecoveryReport) -> None:
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
                if isinstance(outcome, Ok):
                    continue
                if self.expected_state is not None and name in self.expected_state.tables:
                    # The sink lost its open txn after the decision: give it the
                    # changes RECORDED for the epoch (the run that was decided),
                    # never a recomputation. Its marker makes this exactly-once.
                    rows = ReplayRows(self.expected_state, epoch, None)[name]
                    self._steps.replay(sink, txn, rows)
                    continue
                lacking.append(name)
            if lacking:
                report.replay_needed[epoch] = lacking
                continue
            self.progress.mark(epoch, EpochStatus.FINALIZED, generation)
            report.finalized_epochs.append(epoch)
