"""A pipeline run as ``main`` or ``standby``: one leads and streams, the other follows, takes over.

Both instances share the expected-state store and Spark's checkpoint folder.
Only the holder of the lease (``reconcile.ha.lease``) runs the streaming
query. A standby follows the store (it knows the newest decided epoch without
reading any sink) and tries for the lease whenever it runs out. Taking over
(``reconcile.ha.takeover``): end the old writer's sink sessions, claim a new
writer generation and raise every fence to it, bring every sink to the
expected state by scoped pull-and-diff, then start the query from the shared
checkpoint, where Spark re-runs the batch the old main did not finish.

A leader steps down, and becomes a standby, when it cannot renew its lease,
when a fence rejects it (a newer generation took over while it was paused),
or when its query keeps failing. It never claims a generation without the
lease, so a woken main does not fence the new leader in a loop.

Roles differ only at the start: ``main`` tries for the lease at once;
``standby`` first waits one term, so that of two instances started together
the main leads.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconcile.contract import ConfigurationError, FencedError, RetryableError
from reconcile.cycle import CommitCycle
from reconcile.ha.lease import PgLease, wait_s
from reconcile.ha.takeover import (
    LeadershipLostError,
    fence_sinks,
    guard_claims,
    recover_sinks,
    terminate_old_sessions,
)
from reconcile.metrics import Metrics, with_labels
from reconcile.spark.warm import WARM_EVERY_S

__all__ = ["HaNode", "Role", "Tenure"]

log = logging.getLogger("reconcile.ha")

QUERY_FAILURES = 5  # query failures in a row, while leading, before stepping down
# Why a failed query is restarted while we lead: a woken old main may win a
# race on Spark's offset or commit log ("concurrent update") before its fence
# stops it; that is a failure of this run of the query, not of the leader.


class Role(enum.Enum):
    """How an instance starts."""

    MAIN = "main"
    STANDBY = "standby"


@dataclass
class Tenure:
    """One period of leadership of this instance."""

    tenure: int  # the lease's tenure number
    generation: int | None = None  # the writer generation claimed
    acquired_s: float = 0.0  # time.time() when the lease was taken
    started_s: float | None = None  # time.time() when the query started
    first_commit_s: float | None = None  # time.time() of the first epoch this tenure committed
    ended: str | None = None  # why it ended (None: still leading)
    recovered: dict[str, int] = field(default_factory=dict)  # sink -> rows applied at takeover
    sessions_ended: int = 0
    steps: dict[str, float] = field(default_factory=dict)  # takeover step -> seconds


class _Heartbeat(threading.Thread):
    """Renews the lease every ``every_s`` while we lead; sets ``lost`` when it cannot."""

    def __init__(self, lease: PgLease, every_s: float) -> None:
        super().__init__(name=f"reconcile-lease-{lease.pipeline}", daemon=True)
        self.lease, self.every_s = lease, every_s
        self.lost = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                renewed = self.lease.renew()
            except RetryableError as exc:
                # The database did not answer: we may still hold the lease, but
                # held() turns false on our own clock once the term is over.
                log.warning("pipeline %s: lease not renewed: %s", self.lease.pipeline, exc)
                renewed = self.lease.held()
            if not renewed:
                self.lost.set()
                return


class HaNode:
    """Run one streaming pipeline as ``main`` or ``standby`` (see the module docs).

    Args:
        df: the streaming DataFrame (the same one each time the query starts).
        build: makes the pipeline's CommitCycle over fresh sink clients.
        lease: the pipeline's lease (``PgLease``).
        checkpoint, staging, outputs, trigger, query_name, via,
        collect_max_bytes, retry: as for
            ``reconcile.spark.write_stream``; the checkpoint is shared with
            the other instance.
        role: "main" or "standby".
        metrics: where leadership is reported: ``ha.leader`` (1 while this
            instance leads), ``ha.generation``, ``ha.tenure``,
            ``ha.following_epoch``, ``ha.takeovers``, ``ha.step_downs``
            (label ``reason``) and ``ha.takeover`` (seconds from taking the
            lease to the first epoch committed), ``ha.warm`` (seconds a
            standby's warm-up took).
        on_event: called with (event, fields) at each change of role, and
            with "ready" once a standby has warmed its Spark.
        warm: whether a standby warms its Spark while it waits
            (``reconcile.spark.warm``: each transform is run on an empty
            batch; transforms must not have side effects).
    """

    def __init__(
        self,
        df: Any,
        build: Callable[[], CommitCycle],
        *,
        lease: PgLease,
        checkpoint: str,
        staging: str,
        role: Role | str = Role.MAIN,
        outputs: Mapping[str, Any] | None = None,
        trigger: Mapping[str, Any] | None = None,
        query_name: str | None = None,
        via: str = "auto",
        collect_max_bytes: int | None = None,
        retry: Any = None,
        metrics: Metrics | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        warm: bool = True,
    ) -> None:
        try:
            self.role = Role(role)
        except ValueError:
            raise ConfigurationError(f"role must be 'main' or 'standby', got {role!r}") from None
        self.df, self.lease = df, lease
        self.build = guard_claims(build, lease)
        self.stream_args: dict[str, Any] = {
            "checkpoint": checkpoint, "staging": staging, "outputs": outputs,
            "trigger": trigger, "query_name": query_name, "via": via, "retry": retry,
        }  # fmt: skip
        if collect_max_bytes is not None:
            self.stream_args["collect_max_bytes"] = collect_max_bytes
        self.metrics = with_labels(metrics, pipeline=lease.pipeline)
        self.on_event = on_event
        self.poll_s = lease.term_s / 4
        self.tenures: list[Tenure] = []
        self.query: Any = None
        self.following_epoch: int | None = None
        self._follower: CommitCycle | None = None  # never started: reads the store only
        self._heartbeat: _Heartbeat | None = None
        self._failures = 0
        self._rest_until = 0.0  # time.monotonic(): no new try for the lease before this
        self.warm = warm
        self.ready = False  # warmed once: a takeover's first batch runs warm
        self._warmed_at: float | None = None  # time.monotonic() of the last warm-up
        self._warming: threading.Thread | None = None

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
        self._warm_in_background()
        stop.wait(max(wait, 0.01))

    def _warm_in_background(self) -> None:
        """Warm Spark in a thread now and then, so that trying for the lease never waits on it."""
        if not self.warm or self._follower is None:
            return
        if self._warming is not None and self._warming.is_alive():
            return
        if self._warmed_at is not None and time.monotonic() - self._warmed_at < WARM_EVERY_S:
            return
        self._warmed_at = time.monotonic()
        sinks = list(self._follower.sinks)
        following = self.following_epoch
        batch_id = following + 1 if following is not None else 0
        self._warming = threading.Thread(target=self._warm_up, args=(sinks, batch_id),
                                         name="reconcile-warm", daemon=True)  # fmt: skip
        self._warming.start()

    def _warm_up(self, sinks: list[str], batch_id: int) -> None:
        from reconcile.spark.warm import warm_up

        try:
            took = warm_up(self.df, sinks, self.stream_args["outputs"], batch_id=batch_id)
        except Exception as exc:  # warming only saves time: a failure costs a slower takeover
            log.warning("pipeline %s: could not warm Spark: %r", self.lease.pipeline, exc)
            return
        self.metrics.observe("ha.warm", took)
        if not self.ready:
            self.ready = True
            self._event("ready", warm_s=round(took, 3))

    def _take_over(self, tenure: int) -> None:
        """Fence the old writer, converge every sink, start the query; step down on failure."""
        now = Tenure(tenure, acquired_s=time.time())
        self.tenures.append(now)
        self._heartbeat = _Heartbeat(self.lease, self.poll_s)
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
        from reconcile.spark.stream import write_stream

        self.query = write_stream(
            self.df, self.build, started=(cycle, replay_needed), **self.stream_args
        )
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
                # A query that failed raises here; what to do about it (step
                # down if the lease is gone, else restart or step down) is
                # decided below from query.exception(), not by exiting the node.
                log.debug("pipeline %s: the query ended with %s", self.lease.pipeline,
                          type(exc).__name__)  # fmt: skip
        else:
            stop.wait(self.poll_s)
        if self.writer is not None and self.writer.report.committed_epochs:
            self._failures = 0
            if now.first_commit_s is None:
                now.first_commit_s = time.time()
                self.metrics.observe("ha.takeover", now.first_commit_s - now.acquired_s)
                progress = query.recentProgress if query is not None else []
                self._event("first_commit", tenure=now.tenure,
                            since_acquired_s=round(now.first_commit_s - now.acquired_s, 3),
                            since_started_s=round(now.first_commit_s - (now.started_s or 0), 3),
                            batches=[p.get("durationMs") for p in progress][:3])  # fmt: skip
        if heartbeat.lost.is_set() or not self.lease.held():
            self._step_down("lease lost", release=False)
            return
        if query is None or query.isActive:
            return
        error = query.exception()
        text = str(error) if error is not None else ""
        if error is None:
            self._step_down("query finished", release=True)
            stop.set()
            return
        if "FencedError" in text or "LeadershipLostError" in text:
            self._step_down("fenced", release=False)
            return
        self._failures += 1
        log.warning("pipeline %s: the query failed (%d in a row): %s", self.lease.pipeline,
                    self._failures, text.splitlines()[0] if text else error)  # fmt: skip
        self._close_query()
        if self._failures >= QUERY_FAILURES:
            self._step_down("query failing", release=True)
            return
        # Still the leader: a new cycle (a new generation, claimed under the
        # lease) and the query again from the checkpoint.
        cycle = self.build()
        try:
            report = cycle.start()
            self._start_query(cycle, report.replay_needed)
        except (FencedError, RetryableError) as exc:
            cycle.close()
            self._step_down("fenced" if isinstance(exc, FencedError) else "unreachable",
                            release=not isinstance(exc, LeadershipLostError))  # fmt: skip

    def _close_query(self) -> None:
        query, self.query = self.query, None
        if query is None:
            return
        try:
            query.stop()
        except Exception as exc:  # a dead query's stop may fail: it is stopped either way
            log.debug("stopping the query: %r", exc)
        writer = getattr(query, "reconcile_writer", None)
        if writer is not None:
            writer.close()

    def _step_down(self, reason: str, *, release: bool) -> None:
        """Stop the query, stop renewing, give the lease up if asked: a standby again."""
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is None:
            return
        heartbeat.done.set()
        self._close_query()
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
        if self.on_event is not None:
            self.on_event(event, fields)
