"""A pipeline run as ``main`` or ``standby``: one leads and streams, the other follows, takes over.

Both instances share the expected-state store and Spark's checkpoint folder.
Only the holder of the lease (``sinks.postgres.lease``) runs the streaming
query. A standby follows the store (it knows the newest decided epoch without
reading any sink) and tries for the lease whenever it runs out. Taking over
(``reconcile.ha.takeover``): end the old writer's sink sessions, claim a new
writer generation and raise every fence to it, bring every sink to the
expected state by scoped pull-and-diff, then start the query from the shared
checkpoint, where Spark re-runs the batch the old main did not finish.

A leader steps down, and becomes a standby, when it cannot renew its lease
(the database does not answer, or says no), or when a fence rejects it (a
newer generation took over while it was paused). It never claims a
generation without the lease, so a woken main does not fence the new leader
in a loop.

A query that fails is sorted from the typed error its writer kept
(``reconcile.ha.leading.QueryFailures``), never from the text Spark wraps it
in. An epoch rejected by the database, or an error no retry cures, stops the
node: it releases the lease and ``run`` raises the error. Any other failure
runs the query again after a backoff, with the same cycle and writer
generation when nothing was left in doubt; ``QUERY_FAILURES`` failures of one
epoch in a row stop the node too.

Roles differ only at the start: ``main`` tries for the lease at once;
``standby`` first waits one term, so that of two instances started together
the main leads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Unpack

from reconcile.core.contract import ConfigurationError, FencedError, RetryableError
from reconcile.core.decisions import Failure, classify
from reconcile.core.lease import Lease, wait_s
from reconcile.core.metrics import with_labels
from reconcile.engine.cycle import CommitCycle
from reconcile.ha.leading import Heartbeat, QueryFailures, Role, Tenure
from reconcile.ha.options import HaKeywords, HaOptions
from reconcile.ha.takeover import (
    LeadershipLostError,
    fence_sinks,
    guard_claims,
    recover_sinks,
    terminate_old_sessions,
)
from reconcile.ha.warming import StandbyWarmUp
from reconcile.spark.stream import start_query

__all__ = ["HaNode", "Role", "Tenure"]

log = logging.getLogger("reconcile.ha")


class HaNode:
    """Run one streaming pipeline as ``main`` or ``standby`` (see the module docs).

    Args:
        df: the streaming DataFrame (the same one each time the query starts).
        build: makes the pipeline's CommitCycle over fresh sink clients.
        lease: the pipeline's lease (``Lease``).
        **options: the keywords of :class:`~reconcile.ha.options.HaOptions`: the
            streaming query's (``checkpoint`` and ``staging`` required, as for
            ``reconcile.spark.write_stream``; the checkpoint is shared with the
            other instance), and ``role``, ``metrics``, ``on_event``, ``warm``.
    """

    def __init__(
        self,
        df: Any,
        build: Callable[[], CommitCycle],
        *,
        lease: Lease,
        **options: Unpack[HaKeywords],
    ) -> None:
        self.options = HaOptions(**options)
        try:
            self.role = Role(self.options.role)
        except ValueError:
            role = self.options.role
            raise ConfigurationError(f"role must be 'main' or 'standby', got {role!r}") from None
        self.df, self.lease = df, lease
        self.build = guard_claims(build, lease)
        self.metrics = with_labels(self.options.metrics, pipeline=lease.pipeline)
        self.poll_s = lease.term_s / 4
        self.tenures: list[Tenure] = []
        self.query: Any = None
        self.following_epoch: int | None = None
        self._follower: CommitCycle | None = None  # never started: reads the store only
        self._heartbeat: Heartbeat | None = None
        # The failing epoch's failures in a row: kept across restarts and tenures.
        self._failures = QueryFailures(lease.pipeline)
        self._restart_at: float | None = None  # time.monotonic() to start the query again
        # A failed query's cycle, handed on to its next run (same generation).
        self._handed: tuple[CommitCycle, list[int]] | None = None
        self.failure: BaseException | None = None  # what stopped the node, raised by run()
        self._rest_until = 0.0  # time.monotonic(): no new try for the lease before this
        self.ready = False  # warmed once: a takeover's first batch runs warm
        self._warm_up = StandbyWarmUp(df, self.options.outputs, lease.pipeline, self._warmed)

    # -- state -------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        """Whether this instance leads now (holds the lease and runs the query)."""
        return self._heartbeat is not None

    @property
    def tenure(self) -> Tenure | None:
        """The current tenure while leading."""
        return self.tenures[-1] if self.leading else None

    @property
    def writer(self) -> Any:
        """The running query's StreamWriter (its report), or None."""
        return getattr(self.query, "reconcile_writer", None)

    # -- the loop ------------------------------------------------------------------

    def run(
        self,
        until: Callable[[HaNode], bool] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """Lead or follow until ``stop`` is set or ``until(self)`` is true (checked each tick).

        On return the query is stopped and the lease released.

        Raises:
            RejectedError: the database refused an epoch's rows; the node stopped.
            ConfigurationError, MarkerMismatchError, ...: an error no retry
                cures stopped the node (``reconcile.core.decisions.classify``).
            FatalError: one epoch failed ``QUERY_FAILURES`` times in a row.
        """
        stop = stop or threading.Event()
        if self.role is Role.STANDBY:
            self._follow(stop, self.lease.term_s)  # the main's head start
        try:
            while not stop.is_set():
                if until is not None and until(self):
                    return
                if self.leading:
                    self._tick(stop)
                    continue
                rest = self._rest_until - time.monotonic()
                if rest > 0:  # just stepped down: let the others take it first
                    self._follow(stop, min(rest, self.poll_s))
                    continue
                try:
                    state = self.lease.try_acquire()
                except RetryableError as exc:
                    log.warning("pipeline %s: %s", self.lease.pipeline, exc)
                    self._follow(stop, self.poll_s)
                    continue
                if state is None:
                    self._follow(stop, wait_s(self.lease.current(), self.poll_s))
                    continue
                self._take_over(state.tenure)
        finally:
            self._step_down("stopped", release=True)
            if self._follower is not None:
                self._follower.close()
            self.lease.close()
        if self.failure is not None:
            raise self.failure

    def _follow(self, stop: threading.Event, wait: float) -> None:
        """As a standby: read the newest decided epoch from the store, then wait."""
        try:
            if self._follower is None:
                self._follower = self.build()
            self.following_epoch = self._follower.progress.last_committed()
            if self.following_epoch is not None:
                self.metrics.set("ha.following_epoch", self.following_epoch)
        except Exception as exc:  # following is for show: never a reason to stop
            log.warning("pipeline %s: cannot read the store: %r", self.lease.pipeline, exc)
        if self.options.warm and self._follower is not None:
            self._warm_up.poke(list(self._follower.sinks), self.following_epoch)
        stop.wait(max(wait, 0.01))

    def _warmed(self, took: float) -> None:
        self.metrics.observe("ha.warm", took)
        if not self.ready:
            self.ready = True
            self._event("ready", warm_s=round(took, 3))

    def _take_over(self, tenure: int) -> None:
        """Fence the old writer, converge every sink, start the query; step down on failure."""
        now = Tenure(tenure, acquired_s=time.time())
        self.tenures.append(now)
        self._heartbeat = Heartbeat(self.lease, self.poll_s)
        self._heartbeat.start()
        self.metrics.set("ha.leader", 1)
        self.metrics.set("ha.tenure", tenure)
        self._event("acquired", tenure=tenure)
        cycle: CommitCycle | None = None
        clock = time.monotonic()

        def step(name: str) -> None:  # how long each step of the takeover took, for the event
            nonlocal clock
            now.steps[name], clock = round(time.monotonic() - clock, 3), time.monotonic()

        try:
            cycle = self.build()
            now.sessions_ended = terminate_old_sessions(cycle)
            step("end_sessions")
            report = cycle.start()  # claims the generation (lease checked): fences the store
            now.generation = cycle.generation
            step("claim")
            fence_sinks(cycle)
            step("fence")
            now.recovered = recover_sinks(cycle)
            decided = cycle.progress.last_committed()  # before the query decides any more
            step("recover")
            self.metrics.set("ha.generation", float(now.generation or 0))
            self._start_query(cycle, report.replay_needed)
            step("start_query")
        except (FencedError, RetryableError) as exc:
            if cycle is not None and self.query is None:
                cycle.close()
            reason = "fenced" if isinstance(exc, FencedError) else "unreachable"
            log.warning("pipeline %s: takeover failed (%s): %s", self.lease.pipeline, reason, exc)
            self._step_down(reason, release=not isinstance(exc, LeadershipLostError))
            return
        except BaseException:
            if cycle is not None and self.query is None:
                cycle.close()
            raise
        self.following_epoch = cycle.progress.last_committed()
        self.metrics.count("ha.takeovers")
        self._event("leading", tenure=tenure, generation=now.generation,
                    recovered=now.recovered, recovered_to=decided,
                    sessions_ended=now.sessions_ended, steps=now.steps)  # fmt: skip

    def _start_query(self, cycle: CommitCycle, replay_needed: Any) -> None:
        self.query = start_query(self.df, self.build, self.options, started=(cycle, replay_needed))
        if self.tenures:
            self.tenures[-1].started_s = time.time()

    def _tick(self, stop: threading.Event) -> None:
        """While leading: watch the lease and the query for one poll interval."""
        heartbeat, query, now = self._heartbeat, self.query, self.tenures[-1]
        assert heartbeat is not None
        if query is not None:
            try:
                query.awaitTermination(self.poll_s)
            except Exception as exc:
                # A query that failed raises here; what to do about it is
                # decided below from the writer's typed error, not by exiting.
                log.debug("pipeline %s: the query ended with %s", self.lease.pipeline,
                          type(exc).__name__)  # fmt: skip
        elif self._restart_at is None:
            stop.wait(self.poll_s)
        else:  # waiting to start the query again
            stop.wait(min(self.poll_s, max(self._restart_at - time.monotonic(), 0.01)))
        if self.writer is not None and self.writer.report.committed_epochs:
            self._failures.committed()
            if now.first_commit_s is None:
                now.first_commit_s = time.time()
                self.metrics.observe("ha.takeover", now.first_commit_s - now.acquired_s)
                progress = query.recentProgress if query is not None else []
                self._event("first_commit", tenure=now.tenure,
                            since_acquired_s=round(now.first_commit_s - now.acquired_s, 3),
                            since_started_s=round(now.first_commit_s - (now.started_s or 0), 3),
                            batches=[p.get("durationMs") for p in progress][:3])  # fmt: skip
        # held() is checked here as well as by the heartbeat: a renewal that
        # hangs (no answer, no timeout) keeps the heartbeat from ever saying so.
        if heartbeat.lost.is_set() or not self.lease.held():
            self._step_down("lease lost", release=False)
            return
        if query is None:
            if self._restart_at is not None and time.monotonic() >= self._restart_at:
                self._restart_query(stop)
            return
        if query.isActive:
            return
        self._query_ended(query, stop)

    def _query_ended(self, query: Any, stop: threading.Event) -> None:
        """The query is no longer active: finished, fenced, stopped for good, or run again."""
        writer = self.writer
        error = writer.failure if writer is not None else None
        if error is None and query.exception() is None:
            self._step_down("query finished", release=True)
            stop.set()
            return
        said = str(error if error is not None else query.exception()).strip()
        said = said.splitlines()[0] if said else type(error).__name__
        epoch = writer.failed_epoch if writer is not None else None
        after = self._failures.decide(error, epoch, said, self.poll_s)
        if after.action == "step_down":
            self._step_down(after.reason, release=False)
        elif after.action == "stop":
            assert after.error is not None
            log.error("pipeline %s: stopping: %s", self.lease.pipeline, after.error)
            self._close_query()
            self._stop(after.error, after.reason, stop)
        else:
            # Still the leader: the query again from the checkpoint, after the wait.
            self._close_query(hand_on=True)
            self._restart_at = time.monotonic() + after.wait_s

    def _stop(self, error: BaseException, reason: str, stop: threading.Event) -> None:
        """Stop for good: step down, give the lease up, and have run() raise ``error``."""
        self.failure = error
        self._step_down(reason, release=True)
        stop.set()

    def _restart_query(self, stop: threading.Event) -> None:
        """Start the query again: with the failed run's cycle if it was handed on, else a new one.

        A handed-on cycle keeps its writer generation: running a failing
        epoch again claims nothing. A new cycle (the failure left the old one
        in doubt) claims one, under the lease.
        """
        self._restart_at = None
        handed, self._handed = self._handed, None
        cycle: CommitCycle | None = None
        try:
            if handed is not None:
                cycle, replay = handed
            else:
                cycle = self.build()
                replay = sorted(cycle.start().replay_needed)
            self._start_query(cycle, replay)
        except (FencedError, RetryableError) as exc:
            if cycle is not None and self.query is None:
                cycle.close()
            self._step_down("fenced" if isinstance(exc, FencedError) else "unreachable",
                            release=not isinstance(exc, LeadershipLostError))  # fmt: skip
        except Exception as exc:
            if cycle is not None and self.query is None:
                cycle.close()
            if classify(exc) is Failure.TRANSIENT:
                raise
            self._stop(exc, "rejected" if classify(exc) is Failure.REJECTED else "error", stop)

    def _close_query(self, *, hand_on: bool = False) -> None:
        """Stop the query and close its writer; ``hand_on``: keep its cycle for the next run."""
        query, self.query = self.query, None
        if query is None:
            return
        try:
            query.stop()
        except Exception as exc:  # a dead query's stop may fail: it is stopped either way
            log.debug("stopping the query: %r", exc)
        writer = getattr(query, "reconcile_writer", None)
        if writer is not None:
            if hand_on:
                self._handed = writer.driver.detach()
            writer.close()

    def _step_down(self, reason: str, *, release: bool) -> None:
        """Stop the query, stop renewing, give the lease up if asked: a standby again."""
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is None:
            return
        heartbeat.done.set()
        self._close_query()
        self._restart_at = None
        handed, self._handed = self._handed, None
        if handed is not None:
            handed[0].close()
        if release:
            try:
                self.lease.release()
            except RetryableError as exc:  # it runs out on its own within a term
                log.warning("pipeline %s: lease not released: %s", self.lease.pipeline, exc)
        else:
            self.lease.release_locally()
        self.tenures[-1].ended = reason
        if reason != "stopped":
            self._rest_until = time.monotonic() + self.lease.term_s
        self.metrics.set("ha.leader", 0)
        if reason != "stopped":
            self.metrics.count("ha.step_downs", reason=reason)
        self._event("stepped_down", reason=reason, tenure=self.tenures[-1].tenure)
        log.warning("pipeline %s: %s stepped down (%s)", self.lease.pipeline, self.lease.holder,
                    reason)  # fmt: skip

    def _event(self, event: str, **fields: Any) -> None:
        log.info("pipeline %s: %s %s", self.lease.pipeline, event, fields)
        if self.options.on_event is not None:
            self.options.on_event(event, fields)
