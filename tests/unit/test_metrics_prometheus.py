"""PrometheusMetrics: engine names mapped to series on its own registry; the textfile export."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from reconcile import CommitCycle, MemoryProgressLog
from reconcile.cli.config import MetricsSettings, load_config
from reconcile.cli.prometheus import HttpExporter, PrometheusMetrics, TextfileExporter, export
from reconcile.core.contract import ConfigurationError
from reconcile.core.metrics import record_ambiguous_commit, record_drift
from reconcile.engine.faults import Fault, FaultKind, FaultPlan, FaultySink
from sinks.memory.sink import MemorySink, MemoryStore


def samples(metrics: PrometheusMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(metrics.exposition()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(metrics: PrometheusMetrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, tuple(sorted(labels.items()))))


def test_commit_outcomes_and_fatal_as_its_own_series() -> None:
    m = PrometheusMetrics()
    m.count("cycle.outcome.CommitSucceeded", pipeline="shop")
    m.count("cycle.outcome.CommitSucceeded", pipeline="shop")
    m.count("cycle.outcome.CommitAborted", pipeline="shop", step="stage")
    m.count("cycle.outcome.CommitFatal", pipeline="shop", step="commit")
    assert value(m, "reconcile_commits_total", pipeline="shop", outcome="succeeded") == 2
    assert value(m, "reconcile_commits_total", pipeline="shop", outcome="aborted") == 1
    assert value(m, "reconcile_commits_total", pipeline="shop", outcome="fatal") == 1
    assert value(m, "reconcile_commit_fatal_total", pipeline="shop") == 1


def test_a_new_pipeline_starts_its_commit_series_at_zero() -> None:
    # An alert on increase(reconcile_commit_fatal_total[5m]) needs the series
    # to exist before the first Fatal, or that first one is never an increase.
    m = PrometheusMetrics()
    m.observe("cycle.start", 0.2, pipeline="shop")
    assert value(m, "reconcile_commit_fatal_total", pipeline="shop") == 0
    for outcome in ("succeeded", "aborted", "fatal"):
        assert value(m, "reconcile_commits_total", pipeline="shop", outcome=outcome) == 0


def test_every_name_a_running_pipeline_reports_has_a_series_of_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = PrometheusMetrics()
    plan = FaultPlan(
        [
            Fault("sink.b.commit", FaultKind.RETRYABLE),
            Fault("cycle.finalize", FaultKind.RETRYABLE),
            Fault("cycle.stage", FaultKind.RETRYABLE, nth=2),
            Fault("cycle.begin", FaultKind.FATAL, nth=4),
        ]
    )
    store = MemoryStore()
    sinks = [MemorySink("a", store), FaultySink(MemorySink("b", store), plan)]
    cycle = CommitCycle("shop", sinks, MemoryProgressLog(), metrics=m, faults=plan)
    cycle.start()
    results = [cycle.run_epoch(e, {"a": [{"k": e}]}) for e in (0, 1, 1, 2)]
    assert [type(r).__name__ for r in results] == [
        "CommitSucceeded",
        "CommitAborted",
        "CommitSucceeded",
        "CommitFatal",
    ]
    record_ambiguous_commit("shop", "a", "committed", "pg_xact_status", metrics=m)
    record_drift("shop", "a", missing=1, extra=0, changed=0, applied=1, seconds=0.5, metrics=m)
    m.count("drive.retries", pipeline="shop", restart="true")
    names = {name for name, _ in samples(m)}
    for expected in (
        "reconcile_commits_total",
        "reconcile_commit_fatal_total",
        "reconcile_step_seconds_bucket",
        "reconcile_epoch_seconds_count",
        "reconcile_recovery_seconds_count",
        "reconcile_recovered_txns_total",
        "reconcile_sink_retries_total",
        "reconcile_finalize_failures_total",
        "reconcile_last_committed_epoch",
        "reconcile_last_commit_timestamp_seconds",
        "reconcile_epoch_lag_seconds",
        "reconcile_ambiguous_commits_total",
        "reconcile_drift_rows",
        "reconcile_drift_repaired_rows_total",
        "reconcile_verify_runs_total",
        "reconcile_verify_seconds_count",
        "reconcile_drive_retries_total",
    ):
        assert expected in names, expected
    # Nothing fell through to a derived name: every engine name is in the vocabulary.
    assert not m._others, sorted(m._others)
    assert value(m, "reconcile_sink_retries_total", pipeline="shop", sink="b", operation="commit")
    assert value(m, "reconcile_step_seconds_count", pipeline="shop", step="prepare") == 2
    assert value(m, "reconcile_last_committed_epoch", pipeline="shop") == 1
    assert value(m, "reconcile_finalize_failures_total", pipeline="shop") == 1
    lag = value(m, "reconcile_epoch_lag_seconds", pipeline="shop")
    assert lag is not None and 0 <= lag < 60
    assert not [r for r in caplog.records if r.name == "reconcile.prometheus"]


def test_each_instance_has_its_own_registry() -> None:
    a, b = PrometheusMetrics(), PrometheusMetrics()
    a.count("cycle.outcome.CommitFatal", pipeline="p", step="commit")
    assert value(a, "reconcile_commit_fatal_total", pipeline="p") == 1
    assert value(b, "reconcile_commit_fatal_total", pipeline="p") is None
    assert "reconcile_commits" not in REGISTRY._names_to_collectors  # the global one is untouched


def test_an_unknown_name_gets_a_derived_series() -> None:
    m = PrometheusMetrics()
    m.count("my.thing", 2, pipeline="p", where="x")
    m.observe("my.wait", 0.1, pipeline="p")
    m.set("my.level", 4, pipeline="p")
    assert value(m, "reconcile_my_thing_total", pipeline="p", where="x") == 2
    assert value(m, "reconcile_my_wait_seconds_count", pipeline="p") == 1
    assert value(m, "reconcile_my_level", pipeline="p") == 4


def test_an_export_failure_never_reaches_the_pipeline(caplog: pytest.LogCaptureFixture) -> None:
    m = PrometheusMetrics()
    m.count("cycle.outcome.CommitSucceeded", -1, pipeline="p")  # counters cannot go down
    m.count("cycle.outcome.CommitSucceeded", -1, pipeline="p")
    m.set("my.gauge", 1, pipeline="p")
    m.count("my.gauge", pipeline="p")  # the same name as another kind
    warnings = [r.getMessage() for r in caplog.records if r.name == "reconcile.prometheus"]
    assert len(warnings) == 2, warnings  # once per name
    assert value(m, "reconcile_commits_total", pipeline="p", outcome="succeeded") == 0


def test_the_textfile_is_written_whole_and_replaced(tmp_path: Path) -> None:
    m = PrometheusMetrics()
    path = tmp_path / "reconcile.prom"
    exporter = m.textfile(path, interval_s=None)
    m.count("cycle.outcome.CommitFatal", pipeline="p", step="commit")
    exporter.flush()
    first = os.stat(path).st_ino
    m.count("cycle.outcome.CommitFatal", pipeline="p", step="commit")
    exporter.close()
    text = path.read_text()
    assert 'reconcile_commit_fatal_total{pipeline="p"} 2.0' in text
    # Replaced by a rename (a new inode), never rewritten in place, and no temp file left.
    assert os.stat(path).st_ino != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reconcile.prom"]


def test_the_textfile_is_rewritten_in_the_background(tmp_path: Path) -> None:
    m = PrometheusMetrics()
    path = tmp_path / "reconcile.prom"
    with m.textfile(path, interval_s=0.01) as exporter:
        m.count("cycle.outcome.CommitSucceeded", pipeline="p")
        exporter.written.wait(timeout=10)
    assert exporter.writes >= 2  # at least one background write, and the last one
    assert 'reconcile_commits_total{outcome="succeeded",pipeline="p"} 1.0' in path.read_text()


def test_textfile_and_port_errors_name_the_problem(tmp_path: Path) -> None:
    m = PrometheusMetrics()
    with pytest.raises(ConfigurationError, match=r"must end in \.prom"):
        m.textfile(tmp_path / "x.txt")
    with pytest.raises(ConfigurationError, match=r"folder .* is missing"):
        m.textfile(tmp_path / "absent" / "x.prom")
    with m.serve() as taken, pytest.raises(ConfigurationError, match="cannot listen"):
        m.serve(taken.port)


def test_the_lag_is_seconds_since_the_newest_commit_at_scrape_time() -> None:
    m = PrometheusMetrics()
    m.set("cycle.last_commit_time", 1000.0, pipeline="p")  # a commit long ago
    lag = value(m, "reconcile_epoch_lag_seconds", pipeline="p")
    assert lag is not None and lag > 1e9
    assert value(m, "reconcile_last_commit_timestamp_seconds", pipeline="p") == 1000.0


def test_export_starts_what_the_config_file_asks_for(tmp_path: Path) -> None:
    base = '[store]\nroot = "s"\n[pipelines.p.sinks.a]\ndsn = "host=h"\ntable = "t"\nkeys = ["k"]\n'
    served = tmp_path / "served.toml"
    served.write_text(base + "[metrics]\nport = 0\n")
    filed = tmp_path / "filed.toml"
    filed.write_text(base + '[metrics]\ntextfile = "out.prom"\ninterval_s = 60\n')
    http = export(_metrics(served))
    try:
        assert isinstance(http, HttpExporter) and http.port > 0
        http.metrics.count("cycle.outcome.CommitFatal", pipeline="p", step="commit")
        with urllib.request.urlopen(http.url, timeout=10) as response:
            assert b'reconcile_commit_fatal_total{pipeline="p"} 1.0' in response.read()
    finally:
        http.close()
    textfile = export(_metrics(filed))
    assert isinstance(textfile, TextfileExporter) and textfile.interval_s == 60
    textfile.close()
    assert "reconcile_commits_total" in (tmp_path / "out.prom").read_text()


def _metrics(path: Path) -> MetricsSettings:
    settings = load_config(path).metrics
    assert settings is not None
    return settings


def test_leadership_series_have_their_own_names_and_help() -> None:
    metrics = PrometheusMetrics()
    metrics.set("ha.leader", 1, pipeline="p")
    metrics.set("ha.generation", 7, pipeline="p")
    metrics.count("ha.step_downs", pipeline="p", reason="fenced")
    metrics.observe("ha.takeover", 3.5, pipeline="p")
    text = metrics.exposition()
    assert "# HELP reconcile_ha_leader 1 while this instance leads" in text
    assert 'reconcile_ha_leader{pipeline="p"} 1.0' in text
    assert 'reconcile_ha_generation{pipeline="p"} 7.0' in text
    assert 'reconcile_ha_step_downs_total{pipeline="p",reason="fenced"} 1.0' in text
    assert 'reconcile_ha_takeover_seconds_count{pipeline="p"} 1.0' in text
    assert "engine metric ha." not in text  # none fell through to the generic route
