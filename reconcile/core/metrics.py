"""What the engine reports: counters, durations and gauges under dotted names, with labels.

The engine speaks one vocabulary of dotted names (``cycle.outcome.CommitFatal``,
``cycle.step.prepare``, ...) to a :class:`Metrics` object; an exporter maps
them to its own series (``reconcile.cli.prometheus`` for Prometheus). Labels name
*where* (``pipeline``, ``sink``, ``table``, ``step``): a small, bounded set of
values each. Never an epoch, an xid or a key: every label value makes a series.

The commit cycle makes its metrics the *active* ones while ``start()`` and
``run_epoch()`` run (a ``contextvars`` value), so code that has no metrics
object of its own (a sink, the Postgres resolver, recovery code) reports with
``active().count(...)`` or the ``record_*`` functions here. Outside a cycle
``active()`` is a :class:`NullMetrics`. A thread or an executor process does not
inherit it: run work in a pool under ``contextvars.copy_context().run``, or
send the numbers back and record them on the driver.

The names the engine emits (labels in brackets; ``pipeline`` on all of them):

========================================  ======  ==========================================
name                                      kind    meaning
========================================  ======  ==========================================
``cycle.outcome.<Result>``                count   an epoch's result [step, unless succeeded]
``cycle.epoch`` / ``cycle.step.<step>``   time    a run_epoch() / one step of it
``cycle.start``                           time    start(): bind, fence, settle stranded txns
``cycle.last_committed_epoch``            gauge   the newest epoch committed
``cycle.last_commit_time``                gauge   unix time of the newest commit
``cycle.finalize_failed``                 count   committed but not yet finalized
``recovery.committed|aborted|unknown``    count   stranded txns start() committed, aborted,
                                                  or could not decide
``sink.<operation>.retryable``            count   a sink operation retried [sink]
``sink.commit.replayed``                  count   an epoch replayed into a sink [sink]
``commit.ambiguous``                      count   a COMMIT without reply, resolved
                                                  [sink, resolution, decided_by]
``drive.retries``                         count   drive() ran an epoch again [restart]
``pipeline.rejected``                     count   the database refused an epoch's rows; the
                                                  pipeline stopped [sink, sqlstate]
``sink.untrusted_record``                 count   a record in a sink claimed more than the
                                                  store decided: refused [sink, kind]
``drift.found``                           gauge   rows that differ, per verify [table, kind]
``drift.repaired``                        count   rows a repair applied [table]
``drift.checks``                          count   verify/repair runs [table, result]
``drift.seconds``                         time    one verify/repair run [table]
========================================  ======  ==========================================
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

from reconcile.core.results import CommitResult, CommitSucceeded

__all__ = [
    "InMemoryMetrics",
    "LabelledMetrics",
    "Metrics",
    "NullMetrics",
    "activate",
    "active",
    "record_ambiguous_commit",
    "record_drift",
    "record_refusal",
    "record_report",
    "record_result",
    "record_started",
    "timed",
    "with_labels",
]

LabelKey = tuple[tuple[str, str], ...]


def label_key(labels: Mapping[str, str]) -> LabelKey:
    """Labels as a sorted, hashable tuple (every value as a string)."""
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


class Metrics(Protocol):
    """Where the engine reports what it did. Names are dotted, e.g. ``cycle.outcome.aborted``."""

    def count(self, name: str, value: int = 1, **labels: str) -> None:
        """Add ``value`` to counter ``name``."""
        ...

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        """Record one duration for ``name``."""
        ...

    def set(self, name: str, value: float, **labels: str) -> None:
        """Set gauge ``name`` to ``value``."""
        ...


class NullMetrics:
    """Discards everything."""

    def count(self, name: str, value: int = 1, **labels: str) -> None:
        pass

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        pass

    def set(self, name: str, value: float, **labels: str) -> None:
        pass


class InMemoryMetrics:
    """Keeps every counter, duration and gauge, for tests and reports.

    ``counters`` and ``timings`` are keyed by name alone (summed over labels),
    as before labels existed; :meth:`value`, :meth:`durations` and :meth:`gauge`
    select by labels.
    """

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.timings: defaultdict[str, list[float]] = defaultdict(list)
        self.labelled: Counter[tuple[str, LabelKey]] = Counter()
        self.labelled_timings: defaultdict[tuple[str, LabelKey], list[float]] = defaultdict(list)
        self.gauges: dict[tuple[str, LabelKey], float] = {}
        self._lock = threading.Lock()  # a scraper or a test may read while a pipeline runs

    def count(self, name: str, value: int = 1, **labels: str) -> None:
        with self._lock:
            self.counters[name] += value
            self.labelled[(name, label_key(labels))] += value

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        with self._lock:
            self.timings[name].append(seconds)
            self.labelled_timings[(name, label_key(labels))].append(seconds)

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self.gauges[(name, label_key(labels))] = value

    def value(self, name: str, **labels: str) -> int:
        """The counter ``name`` summed over the series that carry all of ``labels``."""
        want = set(label_key(labels))
        with self._lock:
            return sum(v for (n, key), v in self.labelled.items() if n == name and want <= set(key))

    def durations(self, name: str, **labels: str) -> list[float]:
        """Every duration of ``name`` from the series that carry all of ``labels``."""
        want = set(label_key(labels))
        with self._lock:
            return [
                s
                for (n, key), values in self.labelled_timings.items()
                if n == name and want <= set(key)
                for s in values
            ]

    def gauge(self, name: str, **labels: str) -> float | None:
        """The gauge ``name`` with exactly ``labels``, or None if never set."""
        with self._lock:
            return self.gauges.get((name, label_key(labels)))

    def summary(self) -> dict[str, object]:
        """Counters, count / total / max seconds per timing, and gauges, as plain data."""

        def show(name: str, key: LabelKey) -> str:
            return name + ("{" + ",".join(f"{k}={v}" for k, v in key) + "}" if key else "")

        with self._lock:
            return {
                "counters": dict(self.counters),
                "timings": {
                    name: {"count": len(v), "total_s": sum(v), "max_s": max(v)}
                    for name, v in self.timings.items()
                    if v
                },
                "gauges": {show(name, key): v for (name, key), v in self.gauges.items()},
            }


class LabelledMetrics:
    """Adds fixed labels (e.g. the pipeline) to every report; labels given by a call win.

    An object written against the first form of the protocol (``count(name,
    value)`` and ``observe(name, seconds)`` only) keeps working: it gets the
    names without labels, and no gauges.
    """

    def __init__(self, inner: Metrics, **labels: str) -> None:
        if isinstance(inner, LabelledMetrics):
            labels = {**inner.labels, **labels}
            inner = inner.inner
        self.inner: Metrics = inner
        self.labels: dict[str, str] = labels
        self._takes_labels = _takes_labels(inner)

    def _with(self, labels: Mapping[str, str]) -> dict[str, str]:
        return {**self.labels, **labels} if self._takes_labels else {}

    def count(self, name: str, value: int = 1, **labels: str) -> None:
        self.inner.count(name, value, **self._with(labels))

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        self.inner.observe(name, seconds, **self._with(labels))

    def set(self, name: str, value: float, **labels: str) -> None:
        if hasattr(self.inner, "set"):
            self.inner.set(name, value, **self._with(labels))


def _takes_labels(metrics: object) -> bool:
    """Whether ``metrics.count`` accepts labels (``**labels``)."""
    try:
        parameters = inspect.signature(metrics.count).parameters.values()  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return True  # not introspectable (a C extension, a mock): assume the current protocol
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def with_labels(metrics: Metrics | None, **labels: str) -> Metrics:
    """``metrics`` (NullMetrics if None) adding ``labels`` to everything reported through it."""
    if metrics is None or isinstance(metrics, NullMetrics):
        return NullMetrics()  # nothing to label: skip a merge per report
    return LabelledMetrics(metrics, **labels)


@contextmanager
def timed(metrics: Metrics, name: str, **labels: str) -> Iterator[None]:
    """Observe the wall-clock duration of the block under ``name``, even when it raises."""
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics.observe(name, time.perf_counter() - start, **labels)


# -------------------------------------------------------------- the active metrics

_NULL = NullMetrics()
_ACTIVE: ContextVar[Metrics | None] = ContextVar("reconcile_active_metrics", default=None)


def active() -> Metrics:
    """The metrics of the cycle running in this context, or a NullMetrics outside one."""
    return _ACTIVE.get() or _NULL


@contextmanager
def activate(metrics: Metrics) -> Iterator[Metrics]:
    """Make ``metrics`` what :func:`active` returns inside the block (this context only)."""
    token = _ACTIVE.set(metrics)
    try:
        yield metrics
    finally:
        _ACTIVE.reset(token)


# ------------------------------------------------------- the engine's vocabulary


def record_result(metrics: Metrics, result: CommitResult) -> None:
    """Count an epoch's result and, when it is in every sink, set the commit gauges.

    Args:
        metrics: the cycle's metrics (carrying its pipeline label).
        result: what run_epoch() returned.
    """
    kind = type(result).__name__
    if isinstance(result, CommitSucceeded):
        metrics.count(f"cycle.outcome.{kind}")
        metrics.set("cycle.last_committed_epoch", result.epoch)
        if not result.replayed:
            # A replay wrote nothing: the newest commit is as old as it was.
            metrics.set("cycle.last_commit_time", time.time())
    else:
        metrics.count(f"cycle.outcome.{kind}", step=result.step)


def record_started(metrics: Metrics, last_committed: int | None) -> None:
    """After start(): the newest committed epoch the progress log holds (none: nothing)."""
    if last_committed is not None:
        metrics.set("cycle.last_committed_epoch", last_committed)


def record_ambiguous_commit(
    pipeline: str, sink: str, resolution: str, decided_by: str, *, metrics: Metrics | None = None
) -> None:
    """Count one COMMIT whose reply was lost, by how it was resolved.

    Args:
        pipeline: the pipeline of the txn.
        sink: the sink that sent the COMMIT.
        resolution: ``committed``, ``aborted``, ``prepared`` or ``unknown``
            (nothing could settle it: the epoch goes to pull-and-diff).
        decided_by: the evidence (``pg_xact_status``, ``marker``,
            ``pg_prepared_xacts``, ``server history``), ``none`` when unknown.
        metrics: where to count; default: the active metrics.
    """
    (metrics or active()).count(
        "commit.ambiguous",
        pipeline=pipeline,
        sink=sink,
        resolution=resolution,
        decided_by=decided_by,
    )


def record_drift(
    pipeline: str,
    table: str,
    *,
    missing: int,
    extra: int,
    changed: int,
    applied: int = 0,
    seconds: float | None = None,
    metrics: Metrics | None = None,
) -> None:
    """Report what one verify or repair of a sink table found and did.

    Call it once per table per run, with the numbers of its report. The
    ``drift.found`` gauges show the latest run's findings (a scheduled verify
    that finds the same unrepaired drift again must not add it up); the rows a
    repair applied are counted (each repair applies distinct rows).

    Args:
        pipeline: the pipeline.
        table: the sink table (its sink name, or ``schema.table``).
        missing: keys the sink lacked.
        extra: rows the sink held but should not.
        changed: keys the sink held with other values.
        applied: rows written or deleted to repair (0 for a verify or a dry run).
        seconds: how long the run took, if known.
        metrics: where to report; default: the active metrics.

    Raises:
        ValueError: a negative number (a bug in the caller; nothing is reported).
    """
    numbers = {"missing": missing, "extra": extra, "changed": changed, "applied": applied}
    bad = {k: v for k, v in numbers.items() if isinstance(v, bool) or v < 0}
    if bad:
        raise ValueError(f"record_drift({pipeline!r}, {table!r}): negative or bool count {bad}")
    sink = metrics or active()
    for kind in ("missing", "extra", "changed"):
        sink.set("drift.found", numbers[kind], pipeline=pipeline, table=table, kind=kind)
    if applied:
        sink.count("drift.repaired", applied, pipeline=pipeline, table=table)
    drift = missing + extra + changed
    sink.count("drift.checks", pipeline=pipeline, table=table, result="drift" if drift else "clean")
    if seconds is not None:
        sink.observe("drift.seconds", seconds, pipeline=pipeline, table=table)


def record_refusal(
    pipeline: str, table: str, reason: str, *, metrics: Metrics | None = None
) -> None:
    """Report a verify or repair of a sink table that refused to run, and why.

    Counted as a run whose result is the reason (``store_lost_rows``,
    ``store_integrity``, ``mass_change``): the alert on drift sees it beside
    ``clean`` and ``drift``, with nothing written.
    """
    sink = metrics or active()
    sink.count("drift.checks", pipeline=pipeline, table=table, result=reason)


class DriftReport(Protocol):
    """What :func:`record_report` reads from a verify or repair report."""

    @property
    def table(self) -> str: ...
    @property
    def missing(self) -> int: ...
    @property
    def extra(self) -> int: ...
    @property
    def changed(self) -> int: ...
    @property
    def applied(self) -> int: ...
    @property
    def seconds(self) -> float: ...


def record_report(pipeline: str, report: DriftReport, *, metrics: Metrics | None = None) -> None:
    """:func:`record_drift` from a report (``reconcile.recovery.report.ReconcileReport``).

    Args:
        pipeline: the pipeline.
        report: anything with table, missing, extra, changed, applied and seconds.
        metrics: where to report; default: the active metrics.
    """
    record_drift(
        pipeline,
        report.table,
        missing=report.missing,
        extra=report.extra,
        changed=report.changed,
        applied=report.applied,
        seconds=report.seconds,
        metrics=metrics,
    )
