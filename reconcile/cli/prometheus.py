"""Prometheus export: the engine's dotted names as well-named series, on a registry of its own.

``PrometheusMetrics`` is a :class:`reconcile.core.metrics.Metrics`: pass it to a
``CommitCycle`` (``metrics=``), then either serve it (``serve(port)``: an HTTP
``/metrics`` endpoint) or write it for node_exporter's textfile collector
(``textfile(path)``: rewritten atomically). Each instance has its own
``CollectorRegistry``, never the process-wide default, so several pipelines,
several exporters and the tests do not collide.

Every series is listed in ``docs/operations.md``; the mapping from dotted names
is in :meth:`PrometheusMetrics._routes`. A dotted name without a mapping is not
lost: it becomes ``reconcile_<name>_total`` / ``_seconds`` / a gauge, with the
labels of its first report. Exporting never raises into the pipeline: a
failure is logged once per name and the pipeline goes on.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reconcile.cli.prometheus_export import HttpExporter, TextfileExporter

if TYPE_CHECKING:
    from reconcile.cli.config import MetricsSettings

__all__ = ["HttpExporter", "PrometheusMetrics", "TextfileExporter", "export"]

log = logging.getLogger("reconcile.prometheus")

# The commit cycle's result types, as the ``outcome`` label says them.
OUTCOMES = {"CommitSucceeded": "succeeded", "CommitAborted": "aborted", "CommitFatal": "fatal"}

_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SLOW = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
_SINK_OP = re.compile(r"sink\.(?P<operation>\w+)\.retryable")


M = TypeVar("M", Counter, Gauge, Histogram)


@dataclass(frozen=True)
class _Route(Generic[M]):
    """Where one dotted name goes: a metric, its label names, and labels the name fixes."""

    metric: M
    labelnames: tuple[str, ...]
    fixed: Mapping[str, str] = field(default_factory=dict)

    def child(self, labels: Mapping[str, str]) -> M:
        values = [self.fixed.get(n) or str(labels.get(n, "")) for n in self.labelnames]
        return self.metric.labels(*values) if self.labelnames else self.metric

    def but(self, **fixed: str) -> _Route[M]:
        return _Route(self.metric, self.labelnames, fixed)


class _LagCollector(Collector):
    """``reconcile_epoch_lag_seconds``: seconds since each pipeline's newest commit, at scrape."""

    def __init__(self, name: str, commit_times: Mapping[str, float]) -> None:
        self.name, self.commit_times = name, commit_times

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(self.name, _LAG_HELP, labels=["pipeline"])]

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self.name, _LAG_HELP, labels=["pipeline"])
        now = time.time()
        for pipeline, at in sorted(dict(self.commit_times).items()):
            family.add_metric([pipeline], max(0.0, now - at))
        yield family


_LAG_HELP = (
    "Seconds since the pipeline's newest epoch was committed into every sink (grows while it "
    "commits nothing: stopped, stuck retrying, or without input)"
)


class PrometheusMetrics:
    """A Metrics that keeps Prometheus series on its own registry.

    Args:
        registry: the registry to use (default: a new one).
        namespace: the prefix of every series name.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, namespace: str = "reconcile"
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.namespace = namespace
        self._lock = threading.Lock()
        self._commit_times: dict[str, float] = {}
        self._pipelines: set[str] = set()
        self._others: dict[str, _Route[Counter] | _Route[Gauge] | _Route[Histogram]] = {}
        self._failed: set[str] = set()
        self._routes()
        self.registry.register(_LagCollector(f"{namespace}_epoch_lag_seconds", self._commit_times))

    def _make(self, kind: type[M], name: str, text: str, labels: Iterable[str]) -> _Route[M]:
        names = tuple(labels)
        full = f"{self.namespace}_{name}"
        if kind is Histogram:
            buckets = _SLOW if name in ("recovery_seconds", "verify_seconds") else _FAST
            metric = kind(full, text, names, registry=self.registry, buckets=buckets)
        else:
            metric = kind(full, text, names, registry=self.registry)
        return _Route(metric, names)

    def _routes(self) -> None:
        """Create every known series, and the routes from the engine's names to them."""

        def counter(name: str, text: str, labels: list[str]) -> _Route[Counter]:
            return self._make(Counter, name, text, labels)

        def gauge(name: str, text: str, labels: list[str]) -> _Route[Gauge]:
            return self._make(Gauge, name, text, labels)

        def histogram(name: str, text: str, labels: list[str]) -> _Route[Histogram]:
            return self._make(Histogram, name, text, labels)

        self.commits = counter(
            "commits", "Epochs run through the commit cycle, by result", ["pipeline", "outcome"]
        )
        self.commit_fatal = counter(
            "commit_fatal",
            "Epochs that ended CommitFatal: the pipeline stopped (alert on any increase)",
            ["pipeline"],
        )
        self.steps = histogram(
            "step_seconds", "Duration of one step of the commit cycle", ["pipeline", "step"]
        )
        self.retries = counter(
            "sink_retries",
            "Sink operations the cycle retried after a Retryable outcome or an exception",
            ["pipeline", "sink", "operation"],
        )
        recovered = counter(
            "recovered_txns",
            "Stranded txns start() committed, aborted, or could not decide (unknown)",
            ["pipeline", "action"],
        )
        self.last_commit = gauge(
            "last_commit_timestamp_seconds",
            "Unix time of the newest epoch committed into every sink",
            ["pipeline"],
        )
        self._counts: dict[str, _Route[Counter]] = {
            "recovery.committed": recovered.but(action="committed"),
            "recovery.aborted": recovered.but(action="aborted"),
            "recovery.unknown": recovered.but(action="unknown"),
            "cycle.finalize_failed": counter(
                "finalize_failures",
                "Epochs in every sink whose finalize record failed (start() redoes it)",
                ["pipeline"],
            ),
            "sink.commit.replayed": counter(
                "sink_replays",
                "Committed epochs replayed into a sink whose open txn was lost",
                ["pipeline", "sink"],
            ),
            "commit.ambiguous": counter(
                "ambiguous_commits",
                "COMMITs without reply, by how the database resolved them",
                ["pipeline", "sink", "resolution", "decided_by"],
            ),
            "drive.retries": counter(
                "drive_retries",
                "Epochs drive() ran again, in the same cycle or after a restart",
                ["pipeline", "restart"],
            ),
            "pipeline.rejected": counter(
                "rejected_epochs",
                "Epochs whose rows were refused, by the database or the engine's check before "
                "sending (a constraint, a value, a privilege): the pipeline stopped (alert on any "
                "increase)",
                ["pipeline", "sink", "sqlstate"],
            ),
            "sink.untrusted_record": counter(
                "untrusted_records",
                "Records in a sink (a commit, a repair, a newest-epoch mark, a fence) that "
                "claimed more than the store decided: refused, the pipeline stopped (alert on "
                "any increase)",
                ["pipeline", "sink", "kind"],
            ),
            "drift.repaired": counter(
                "drift_repaired_rows", "Rows written or deleted by repairs", ["pipeline", "table"]
            ),
            "drift.checks": counter(
                "verify_runs",
                "Verify or repair runs of a sink table, by what they found",
                ["pipeline", "table", "result"],
            ),
            "ha.takeovers": counter(
                "ha_takeovers", "Times this instance took the lead (reconcile.ha)", ["pipeline"]
            ),
            "ha.step_downs": counter(
                "ha_step_downs",
                "Times this instance stopped leading, by why (lease lost, fenced, ...)",
                ["pipeline", "reason"],
            ),
        }
        self._times: dict[str, _Route[Histogram]] = {
            "cycle.epoch": histogram("epoch_seconds", "Duration of run_epoch()", ["pipeline"]),
            "drift.seconds": histogram(
                "verify_seconds",
                "Duration of one verify or repair of a sink table",
                ["pipeline", "table"],
            ),
            "cycle.start": histogram(
                "recovery_seconds",
                "Duration of start(): bind the sinks, fence older writers, settle stranded txns",
                ["pipeline"],
            ),
            "ha.takeover": histogram(
                "ha_takeover_seconds",
                "From taking the lease to the first epoch this instance committed",
                ["pipeline"],
            ),
            "ha.warm": histogram(
                "ha_warm_seconds", "Duration of a standby's warm-up of Spark", ["pipeline"]
            ),
        }
        self._gauges: dict[str, _Route[Gauge]] = {
            "cycle.last_committed_epoch": gauge(
                "last_committed_epoch", "The newest epoch committed into every sink", ["pipeline"]
            ),
            "cycle.last_commit_time": self.last_commit,
            "drift.found": gauge(
                "drift_rows",
                "Rows that differed from the expected state at the latest verify or repair",
                ["pipeline", "table", "kind"],
            ),
            "drift.foreign_writes": gauge(
                "drift_foreign_writes",
                "Differing rows a foreign transaction (neither a marker's nor a repair's) last "
                "wrote, among those the latest verify or repair traced",
                ["pipeline", "table"],
            ),
            "ha.leader": gauge(
                "ha_leader",
                "1 while this instance leads the pipeline, 0 while it follows",
                ["pipeline"],
            ),
            "ha.generation": gauge(
                "ha_generation",
                "The writer generation this instance claimed at its takeover",
                ["pipeline"],
            ),
            "ha.tenure": gauge(
                "ha_tenure",
                "The lease's tenure this instance holds (one more at every takeover)",
                ["pipeline"],
            ),
            "ha.following_epoch": gauge(
                "ha_following_epoch",
                "The newest decided epoch, as a standby reads it from the store",
                ["pipeline"],
            ),
        }

    # ------------------------------------------------------------ Metrics

    def count(self, name: str, value: int = 1, **labels: str) -> None:
        """Add ``value`` to the counter ``name`` maps to."""
        with self._guard(name):
            pipeline = self._see(labels)
            if name.startswith("cycle.outcome."):
                kind = name.removeprefix("cycle.outcome.")
                outcome = OUTCOMES.get(kind, kind.lower())
                self.commits.child({"pipeline": pipeline, "outcome": outcome}).inc(value)
                if kind == "CommitFatal":
                    # Its own series, so that an alert needs no label matching.
                    self.commit_fatal.child(labels).inc(value)
                return
            op = _SINK_OP.fullmatch(name)
            if op is not None:
                self.retries.child({**labels, "operation": op["operation"]}).inc(value)
                return
            route = self._counts.get(name) or self._fallback(name, labels, Counter, "")
            route.child(labels).inc(value)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        """Record a duration in the histogram ``name`` maps to."""
        with self._guard(name):
            self._see(labels)
            if name.startswith("cycle.step."):
                step = name.removeprefix("cycle.step.")
                self.steps.child({**labels, "step": step}).observe(seconds)
                return
            route = self._times.get(name) or self._fallback(name, labels, Histogram, "_seconds")
            route.child(labels).observe(seconds)

    def set(self, name: str, value: float, **labels: str) -> None:
        """Set the gauge ``name`` maps to."""
        with self._guard(name):
            pipeline = self._see(labels)
            route = self._gauges.get(name) or self._fallback(name, labels, Gauge, "")
            route.child(labels).set(value)
            if name == "cycle.last_commit_time":
                with self._lock:
                    self._commit_times[pipeline] = float(value)

    # ------------------------------------------------------------- export

    def serve(self, port: int = 0, addr: str = "127.0.0.1") -> HttpExporter:
        """Serve ``/metrics`` on ``addr:port`` (0: a free port) until ``close()``."""
        return HttpExporter(self, port, addr)

    def textfile(self, path: str | Path, *, interval_s: float | None = 15.0) -> TextfileExporter:
        """Write the series to ``path`` (``*.prom``) every ``interval_s`` and at ``close()``."""
        return TextfileExporter(self, path, interval_s=interval_s)

    def exposition(self) -> str:
        """The series in Prometheus' text format (what a scrape returns)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()

    # ------------------------------------------------------------ helpers

    def _see(self, labels: Mapping[str, str]) -> str:
        """The pipeline label; a new pipeline's commit series start at zero."""
        pipeline = str(labels.get("pipeline", ""))
        if pipeline not in self._pipelines:
            with self._lock:
                self._pipelines.add(pipeline)
            # A counter that first appears at 1 hides that first increase from
            # increase()/rate(): every pipeline's outcomes exist from its first report.
            for outcome in OUTCOMES.values():
                self.commits.child({"pipeline": pipeline, "outcome": outcome})
            self.commit_fatal.child({"pipeline": pipeline})
        return pipeline

    def _fallback(
        self, name: str, labels: Mapping[str, str], kind: type[M], suffix: str
    ) -> _Route[M]:
        """A series for a name outside the engine's vocabulary, with its first labels."""
        with self._lock:
            route = self._others.get(name)
            if route is None:
                base = re.sub(r"[^a-zA-Z0-9_]", "_", name) + suffix
                route = self._make(kind, base, f"engine metric {name}", sorted(labels))
                self._others[name] = route
        if not isinstance(route.metric, kind):
            raise TypeError(f"{name!r} was reported as a {type(route.metric).__name__} before")
        return route

    def _guard(self, name: str) -> _Guard:
        return _Guard(self, name)


class _Guard:
    """Swallows an export failure (logged once per name): metrics never stop a pipeline."""

    def __init__(self, owner: PrometheusMetrics, name: str) -> None:
        self.owner, self.name = owner, name

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        if self.name not in self.owner._failed:
            self.owner._failed.add(self.name)
            log.warning("metric %r not exported: %r (reported once)", self.name, exc)
        return True


def export(
    settings: MetricsSettings, metrics: PrometheusMetrics | None = None
) -> HttpExporter | TextfileExporter:
    """Start the export a config file's ``[metrics]`` table asks for.

    Args:
        settings: ``Config.metrics`` (a port, or a textfile).
        metrics: the metrics to export (default: a new PrometheusMetrics).

    Returns:
        The exporter; its ``metrics`` goes to the cycles, ``close()`` at the end.

    Raises:
        ConfigurationError: the port is taken, or the textfile's folder is missing.
    """
    metrics = metrics or PrometheusMetrics()
    if settings.textfile is not None:
        return metrics.textfile(settings.textfile, interval_s=settings.interval_s)
    assert settings.port is not None
    return metrics.serve(settings.port, settings.addr)
