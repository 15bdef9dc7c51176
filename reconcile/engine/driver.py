"""Drives a pipeline epoch by epoch: retries with backoff, restarts when in doubt, resumes.

``drive(build, epochs, outputs)`` is the loop a pipeline runs. Calling it again
with the same arguments after it stopped (a crash, a kill, an error an
operator fixed) continues where it stopped: epochs already in every sink are
skipped, an epoch left in doubt is finished (replayed into sinks that need
its outputs again), and the rest run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from reconcile.core.contract import (
    ContractViolationError,
    FatalError,
    InvalidInputError,
    OutcomeUnknownError,
    ReconcileError,
    RetryableError,
)
from reconcile.core.decisions import Failure, classify, rejection_of
from reconcile.core.progress import EpochStatus
from reconcile.core.results import CommitAborted, CommitFatal, CommitResult, CommitSucceeded
from reconcile.engine.cycle import CommitCycle
from reconcile.engine.faults import SimulatedCrash

__all__ = ["DriveReport", "Driver", "RetryPolicy", "drive"]

log = logging.getLogger("reconcile.driver")


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how fast ``drive`` retries an epoch that does not go through.

    Waits grow exponentially from ``initial_s`` up to ``max_s``, with random
    jitter (so restarted writers do not retry in lock-step), until the epoch
    has been failing for ``give_up_after_s`` seconds. The default rides out a
    database restart of well over 30 seconds.
    """

    give_up_after_s: float = 120.0
    initial_s: float = 0.05
    max_s: float = 5.0
    jitter_s: float = 0.25

    def __post_init__(self) -> None:
        if self.give_up_after_s <= 0 or self.initial_s < 0 or self.max_s < self.initial_s:
            raise ValueError(f"invalid retry policy {self}")


@dataclass
class DriveReport:
    """What a drive did: every cycle result, and how often it retried and restarted.

    ``restarts`` counts new cycles built after the first (each one claims a
    writer generation); ``retries`` counts epochs run again in the same cycle.
    """

    results: list[CommitResult] = field(default_factory=list)
    restarts: int = 0
    retries: int = 0
    committed_epochs: list[int] = field(default_factory=list)
    skipped_epochs: list[int] = field(default_factory=list)  # already in: not run again


class _Again(Exception):
    """Internal: the epoch did not go through; wait, then try again (restart if asked)."""

    def __init__(self, reason: str, *, restart: bool, error: BaseException | None = None) -> None:
        super().__init__(reason)
        self.reason, self.restart, self.error = reason, restart, error


class _Stop(Exception):
    """Internal: no retry can cure this; ``drive`` raises ``error`` itself.

    ``in_doubt``: the cycle may hold something unsettled (an outcome only
    recovery can settle, a sink that broke the contract), so it is not
    handed on (``Driver.detach``); only a new cycle's ``start()`` may go on.
    """

    def __init__(self, error: BaseException, *, in_doubt: bool = False) -> None:
        super().__init__(str(error))
        self.error, self.in_doubt = error, in_doubt


class _Run:
    """One drive: the current cycle, the report, and the first real error seen."""

    def __init__(
        self,
        build: Callable[[], CommitCycle],
        on_progress: Callable[[int, CommitResult], None] | None,
    ) -> None:
        self.build, self.on_progress = build, on_progress
        self.outputs: Callable[[int], Mapping[str, Iterable[Any]]] = _no_outputs
        self.report = DriveReport()
        self.cycle: CommitCycle | None = None
        self.started = False
        self.to_finish: list[int] = []  # committed epochs a sink still lacks
        self.first_error: str | None = None

    def restart(self) -> None:
        """Throw the cycle and its sink clients away, as a process exit would."""
        if self.cycle is not None:
            self.report.restarts += 1
        self.discard()

    def discard(self) -> None:
        """Close the cycle and forget it: the next attempt builds and starts a new one."""
        if self.cycle is not None:
            self.cycle.close()
        self.cycle, self.started, self.to_finish = None, False, []

    def started_cycle(self) -> CommitCycle:
        """The current cycle, built and started if needed, with in-doubt epochs finished."""
        if self.cycle is None:
            self.cycle = self.build()
        cycle = self.cycle
        if not self.started:
            report = cycle.start()
            self.started = True
            self.to_finish = sorted(report.replay_needed)
        while self.to_finish:
            # The log says committed, a sink without a durable prepare lacks it:
            # replay its outputs into that sink before anything newer runs.
            epoch = self.to_finish[0]
            self.record(epoch, cycle.run_epoch(epoch, self.outputs(epoch)), finishing=True)
            self.to_finish.pop(0)
        return cycle

    def record(self, epoch: int, result: CommitResult, *, finishing: bool = False) -> None:
        """Keep a result; raise _Again or _Stop if it did not go through."""
        self.report.results.append(result)
        if self.on_progress is not None:
            self.on_progress(epoch, result)
        if isinstance(result, CommitSucceeded):
            if not finishing:
                self.report.committed_epochs.append(epoch)
            return
        if self.first_error is None:
            self.first_error = f"epoch {epoch} {result.step}: {result.reason}"
        if classify(result.error) is not Failure.TRANSIENT:
            # Rejected by the database, fenced, or a cause no retry cures,
            # whatever the result says: retrying would only repeat it.
            in_doubt = isinstance(result, CommitFatal) and result.restart
            raise _Stop(result.error or FatalError(result.reason), in_doubt=in_doubt)
        if isinstance(result, CommitAborted):
            self.report.retries += 1
            raise _Again(result.reason, restart=False, error=result.error)
        if not result.restart:
            raise _Stop(result.error or FatalError(result.reason, epoch=epoch))
        raise _Again(result.reason, restart=True, error=result.error)

    def attempt(self, epoch: int) -> None:
        """Run ``epoch`` once; map every way it can fail to _Again or _Stop."""
        try:
            cycle = self.started_cycle()
            if self._already_in(cycle, epoch):
                self.report.skipped_epochs.append(epoch)
                return
            self.record(epoch, cycle.run_epoch(epoch, self.outputs(epoch)))
        except (_Again, _Stop):
            raise
        except (ContractViolationError, OutcomeUnknownError) as exc:
            # A broken sink, or an outcome only an operator (or repair) can settle.
            raise _Stop(exc, in_doubt=True) from exc
        except ReconcileError as exc:
            if classify(exc) is not Failure.TRANSIENT or isinstance(exc, FatalError):
                # FatalError from start(): a sink cannot list or settle what it
                # holds, in a way it says no retry fixes. A restart would only
                # claim generation after generation to fail the same way.
                raise _Stop(exc) from exc
            self.first_error = self.first_error or f"epoch {epoch}: {exc}"
            # Retryable: a sink unreachable or busy during start(): start() again
            # on the same cycle (the same generation) after a wait.
            again_start = isinstance(exc, RetryableError) and not self.started
            raise _Again(str(exc), restart=not again_start, error=exc) from exc
        except SimulatedCrash as exc:
            raise _Again(f"crash: {exc}", restart=True) from None

    @staticmethod
    def _already_in(cycle: CommitCycle, epoch: int) -> bool:
        """An epoch finalized below the newest committed one is in: skip it."""
        last = cycle.progress.last_committed()
        if last is None or epoch >= last:
            return False
        return cycle.progress.status(epoch) is EpochStatus.FINALIZED


def drive(
    build: Callable[[], CommitCycle],
    epochs: Iterable[int],
    outputs: Callable[[int], Mapping[str, Iterable[Any]]],
    *,
    retry: RetryPolicy | None = None,
    on_progress: Callable[[int, CommitResult], None] | None = None,
) -> DriveReport:
    """Run ``epochs`` in order until each one is in every sink.

    ``build`` makes a fresh cycle over fresh sink clients, as a restarted
    process would; ``outputs(epoch)`` recomputes an epoch's rows. What happens
    when an epoch does not go through:

    - CommitAborted (nothing of it is anywhere): run it again in the same
      cycle after a backoff wait;
    - CommitFatal with ``restart`` (something is in doubt), a crash, or a
      start() that could not settle what it found: restart (a new cycle, whose
      start() resolves what is in doubt), then the same epoch again;
    - a sink unreachable during start(): start() again after a wait (no new
      generation is claimed);
    - an error no retry can cure (bad input, configuration, a fenced zombie, a
      marker of another state, a broken sink, a Fatal outcome before the commit
      point): raised at once;
    - a rejection by the database (a constraint, a value, a privilege:
      ``RejectedError``, as ``reconcile.core.decisions.classify`` sorts it): raised at
      once, logged and counted (``pipeline.rejected``): every retry would fail
      the same way.

    Waits follow ``retry`` (exponential with jitter); an epoch that keeps failing
    for ``retry.give_up_after_s`` raises FatalError with its first and last errors.

    Resuming: epochs already finalized before this call (below the newest
    committed one) are skipped and listed in ``skipped_epochs``, so running the
    same call again after a stop continues where it stopped.

    Raises:
        FatalError: an epoch kept failing for longer than the policy allows, or
            a Fatal outcome stopped it (the typed cause when there is one).
        ReconcileError: at once, as above, for an error no retry can cure:
            RejectedError, InvalidInputError, ConfigurationError, FencedError,
            MarkerMismatchError, ContractViolationError.
        OutcomeUnknownError: from start(): only pull-and-diff (or an operator) can settle it.
    """
    driver = Driver(build, retry=retry, on_progress=on_progress)
    try:
        for epoch in epochs:
            driver.run(epoch, outputs)
    finally:
        driver.close()  # a clean exit closes connections, as a process end would
    return driver.report


def _no_outputs(epoch: int) -> Mapping[str, Iterable[Any]]:
    raise AssertionError(f"epoch {epoch}: outputs asked for outside Driver.run")


class Driver:
    """``drive``'s rules applied one epoch at a time, over a cycle kept between epochs.

    For a pipeline whose epochs arrive one by one and are not known in advance,
    such as a stream's micro-batches: ``run(epoch, outputs)`` returns once the
    epoch is in every sink, retrying and restarting exactly as ``drive`` does,
    and keeps the started cycle (its writer generation, its connections) for the
    next epoch. ``drive`` is a loop over it.
    """

    def __init__(
        self,
        build: Callable[[], CommitCycle],
        *,
        retry: RetryPolicy | None = None,
        on_progress: Callable[[int, CommitResult], None] | None = None,
    ) -> None:
        self.policy = retry or RetryPolicy()
        self._run = _Run(build, on_progress)

    @property
    def report(self) -> DriveReport:
        """What every ``run`` so far did (committed, skipped, retries, restarts)."""
        return self._run.report

    @property
    def cycle(self) -> CommitCycle | None:
        """The current cycle, if one is built (None after a restart threw it away)."""
        return self._run.cycle

    @property
    def started(self) -> bool:
        """Whether the current cycle's ``start()`` has run (it runs inside ``run``)."""
        return self._run.cycle is not None and self._run.started

    def adopt(self, cycle: CommitCycle, replay_needed: Iterable[int] = ()) -> None:
        """Go on with ``cycle``, which the caller built and started (a takeover did).

        ``replay_needed`` is its ``start()`` report's ``replay_needed``: those
        epochs are finished before the next one runs, as after any start.

        Raises:
            InvalidInputError: the cycle was not started, or this driver has one already.
        """
        if cycle.generation is None:
            raise InvalidInputError("Driver.adopt() takes a started cycle (call start() first)")
        if self._run.cycle is not None:
            raise InvalidInputError("Driver.adopt(): this driver has a cycle already")
        self._run.cycle, self._run.started = cycle, True
        self._run.to_finish = sorted(replay_needed)

    def current(self) -> CommitCycle:
        """The current cycle, built if there is none; ``run`` starts it."""
        if self._run.cycle is None:
            self._run.cycle = self._run.build()
        return self._run.cycle

    def run(self, epoch: int, outputs: Callable[[int], Mapping[str, Iterable[Any]]]) -> None:
        """Run ``epoch`` until it is in every sink (see ``drive`` for how, and what it raises).

        ``outputs(e)`` computes epoch ``e``'s rows; it is asked for an earlier
        epoch only when a restart finds that epoch committed in the log and
        missing from a sink without a durable prepare.
        """
        run, policy = self._run, self.policy
        run.outputs, run.first_error = outputs, None  # an epoch's own first error is named

        def before_sleep(state: RetryCallState) -> None:
            again = state.outcome.exception() if state.outcome else None
            if isinstance(again, _Again):
                cycle = run.cycle  # report through it before restart() throws it away
                if cycle is not None:
                    cycle.metrics.count("drive.retries", restart=str(again.restart).lower())
                if again.restart:
                    run.restart()
                log.warning(
                    "retrying in %.2fs (%s, attempt %d): %s",
                    state.next_action.sleep if state.next_action else 0.0,
                    "restart" if again.restart else "same cycle",
                    state.attempt_number,
                    again.reason,
                    extra={"pipeline": cycle.pipeline if cycle else None, "epoch": state.args[0]},
                )

        retrying = Retrying(
            retry=retry_if_exception_type(_Again),
            stop=stop_after_delay(policy.give_up_after_s),
            wait=wait_exponential_jitter(
                multiplier=policy.initial_s, max=policy.max_s, jitter=policy.jitter_s
            ),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            retrying(run.attempt, epoch)
        except _Stop as stop:
            self._stopped(epoch, stop)
            raise stop.error from None
        except _Again as last:
            if last.restart:
                run.discard()  # in doubt: only a new cycle's start() may go on
            raise FatalError(
                f"epoch {epoch} did not commit within {policy.give_up_after_s:g}s: first "
                f"error: {run.first_error or last.reason}; last error: {last.reason}",
                epoch=epoch,
            ) from last.error
        except BaseException:
            run.discard()  # not the cycle's own outcome: nothing says what it left behind
            raise
        finally:
            run.outputs = _no_outputs

    def _stopped(self, epoch: int, stop: _Stop) -> None:
        """Before ``run`` raises a stop: report a rejection; drop a cycle left in doubt."""
        run = self._run
        rejected = rejection_of(stop.error)
        if rejected is not None and run.cycle is not None:
            # Counted once, where the pipeline stops: the alert an operator gets.
            run.cycle.metrics.count("pipeline.rejected", sink=str(rejected.details.get("sink")),
                                    sqlstate=rejected.sqlstate)  # fmt: skip
            log.error("pipeline %s stops: %s", run.cycle.pipeline, rejected,
                      extra={"pipeline": run.cycle.pipeline, "epoch": epoch})  # fmt: skip
        if stop.in_doubt:
            run.discard()

    def detach(self) -> tuple[CommitCycle, list[int]] | None:
        """Hand the started cycle over, and forget it; None if there is none to hand over.

        For a streaming query run again by the same leader after a failure
        (``reconcile.ha``): the next writer goes on with this cycle
        (``write_stream(..., started=...)``) and its writer generation, rather
        than claiming a new one for each run of a failing epoch. After a
        failure that left the cycle in doubt, there is none: ``run`` has thrown
        it away, and only a new cycle's ``start()`` may settle what it left.

        Returns:
            The cycle and the committed epochs it must still finish before the
            next one (as ``adopt`` takes them), or None.
        """
        run = self._run
        if run.cycle is None or not run.started:
            return None
        handed = (run.cycle, list(run.to_finish))
        run.cycle, run.started, run.to_finish = None, False, []
        return handed

    def close(self) -> None:
        """Close the current cycle's sinks, as a process end would."""
        if self._run.cycle is not None:
            self._run.cycle.close()
            self._run.cycle, self._run.started = None, False
