"""The end of a demo run: verify the sinks, check them against TPC-H itself, and sum up.

Two independent checks, both reading PostgreSQL:

- pull-and-diff against the expected state (``reconcile.recover`` in a dry
  run, full mode): the missing, extra and changed rows, which must be 0;
- the source's own arithmetic: every lineitem row exactly once, each with its
  epoch, and each customer's revenue and line count equal to what the
  generated files add up to (exact decimals). A total counted twice, or a row
  lost, fails this even if the expected state itself were wrong.

The latency of a row is from its file's drop into the watched folder to the
commit of the sink transaction that made it visible (``pg_xact_commit_timestamp``
of its ``xmin``; needs ``track_commit_timestamp = on``, which the embedded
server has).
"""

from __future__ import annotations

import bisect
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

from reconcile.demo.tpch.data import Feed, truth
from reconcile.demo.tpch.events import EventLog
from reconcile.demo.tpch.pipeline import KEYS, PIPELINE

__all__ = ["Summary", "audit", "row_latencies"]


@dataclass
class Summary:
    """What a demo run did and found (``--json`` prints it as one object)."""

    epochs: int  # lineitem files (one micro-batch each, unless Spark takes two at a restart)
    committed_epochs: int  # micro-batches committed
    crashes: int
    crash_points: list[str]
    ambiguous_commits: int
    ambiguous_resolutions: dict[str, int]  # "committed by pg_xact_status" -> n
    connection_faults: dict[str, int]  # the proxy's faults, by kind
    recoveries: int  # restarts that brought the sinks to the expected state first
    recovered_rows: int  # the rows those pull-and-diff runs applied
    replayed_epochs: int  # epochs given to a sink again from the expected state
    missing: int
    extra: int
    changed: int
    source_check: dict[str, Any]
    verified: bool
    latency_ms: dict[str, Any]
    launches: int
    failures: int
    workdir: str | None  # None once the run's own temporary folder was removed
    settings: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


def _percentiles(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None, "rows": 0}
    import numpy as np

    array = np.asarray(values) * 1000.0
    return {
        "p50": round(float(np.percentile(array, 50)), 1),
        "p95": round(float(np.percentile(array, 95)), 1),
        "p99": round(float(np.percentile(array, 99)), 1),
        "max": round(float(array.max()), 1),
        "rows": len(values),
    }


def row_latencies(conn: psycopg.Connection[Any], feed: Feed) -> list[tuple[int, float]]:
    """(file index, seconds from the file's drop to the row's commit) per lineitem row.

    Rows whose commit time is unknown (``track_commit_timestamp`` was off when
    they committed) are left out.
    """
    spans = sorted(
        (s.lo, s.hi, s.index, feed.path(s.index).stat().st_mtime)
        for s in feed.slices
        if feed.path(s.index).exists()
    )
    starts = [lo for lo, _, _, _ in spans]
    out: list[tuple[int, float]] = []
    rows = conn.execute(
        "SELECT l_orderkey, extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 "
        "FROM public.demo_lineitem"
    )
    for key, visible in rows:
        i = bisect.bisect_right(starts, key) - 1
        if i >= 0 and visible is not None and key < spans[i][1]:
            out.append((spans[i][2], visible - spans[i][3]))
    return out


def latencies(conn: psycopg.Connection[Any], feed: Feed) -> list[float]:
    """Seconds from each lineitem row's event (its file's drop) to its commit."""
    on = conn.execute("SHOW track_commit_timestamp").fetchone()
    if not on or on[0] != "on":
        return []
    return [max(0.0, seconds) for _, seconds in row_latencies(conn, feed)]


def source_check(conn: psycopg.Connection[Any], tpch: Path) -> dict[str, Any]:
    """The sinks against the generated files' own totals (not the expected state)."""
    expected = truth(tpch)
    lines, distinct, no_epoch = conn.execute(
        "SELECT count(*), count(DISTINCT (l_orderkey, l_linenumber)), "
        "count(*) FILTER (WHERE _epoch IS NULL) FROM public.demo_lineitem"
    ).fetchone() or (0, 0, 0)
    got = {
        cust: (revenue, n)
        for cust, revenue, n in conn.execute(
            "SELECT o_custkey, revenue, lines FROM public.demo_customer_revenue"
        )
    }
    wrong = [
        cust for cust in expected.revenue.keys() | got.keys()
        if got.get(cust) != (expected.revenue.get(cust, Decimal("NaN")), expected.count.get(cust))
    ]  # fmt: skip
    return {
        "lineitem_rows": lines,
        "lineitem_expected": expected.lines,
        "lineitem_duplicates": lines - distinct,
        "rows_without_epoch": no_epoch,
        "customers": len(got),
        "customers_expected": len(expected.revenue),
        "customers_wrong": len(wrong),
        "ok": lines == distinct == expected.lines and not no_epoch and not wrong,
    }


def audit(
    dsn: str,
    workdir: Path,
    feed: Feed,
    events: EventLog,
    epochs: int,
    step: Callable[[str], object] = lambda _: None,
) -> Summary:
    """Verify both sink tables and sum the event log up; ``step`` is told each check begun."""
    from reconcile.recovery.api import recover

    store = str(workdir / "expected_state")
    drift = Counter[str]()
    for table in KEYS:
        step(f"verifying {table} against its expected state (full mode)")
        found = recover(dsn, store, PIPELINE, table, mode="full", dry_run=True)
        drift.update(missing=found.missing, extra=found.extra, changed=found.changed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        step("checking the tables against TPC-H itself")
        source = source_check(conn, workdir / "tpch")
        step("measuring event-to-visible latency")
        latency = _percentiles(latencies(conn, feed))
    resolutions: Counter[str] = Counter()
    replayed = 0
    for metric in events.of("metric"):
        labels = metric.get("labels", {})
        if metric["name"] == "commit.ambiguous":
            key = f"{labels.get('resolution')} by {labels.get('decided_by')}"
            resolutions[key] += metric["value"]
        elif metric["name"] == "sink.commit.replayed":
            replayed += metric["value"]
    faults: Counter[str] = Counter()
    for entry in events.of("proxy"):
        faults.update(entry.get("injected", {}))
    recoveries = events.of("recovery")  # one per table per restart that found epochs
    crashes = events.of("crash")
    committed = {e["epoch"] for e in events.of("committed")}
    return Summary(
        epochs=epochs,
        committed_epochs=len(committed),
        crashes=len(crashes),
        crash_points=[f"{c['point']} ({c['where']})" for c in crashes],
        ambiguous_commits=sum(resolutions.values()),
        ambiguous_resolutions=dict(resolutions),
        connection_faults=dict(faults),
        recoveries=len({r["pid"] for r in recoveries}),
        recovered_rows=sum(r["applied"] for r in recoveries),
        replayed_epochs=replayed,
        missing=drift["missing"],
        extra=drift["extra"],
        changed=drift["changed"],
        source_check=source,
        verified=not (drift["missing"] or drift["extra"] or drift["changed"]) and source["ok"],
        latency_ms=latency,
        launches=len(events.of("launch")),
        failures=len(events.of("failed")),
        workdir=str(workdir),
    )


def _seconds(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def render(summary: Summary) -> None:
    """The summary as tables on the terminal (rich)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="reconcile demo", show_header=False)
    table.add_column("what")
    table.add_column("value")
    s = summary
    table.add_row("lineitem files / micro-batches committed", f"{s.epochs} / {s.committed_epochs}")
    table.add_row("crashes (SIGKILL)", f"{s.crashes}" + "".join(
        f"\n  {p.partition(' (')[2].rstrip(')')}" for p in s.crash_points))  # fmt: skip
    table.add_row("pipeline launches / failed exits", f"{s.launches} / {s.failures}")
    table.add_row(
        "connection faults injected",
        ", ".join(f"{k}: {v}" for k, v in s.connection_faults.items()) or "none",
    )
    table.add_row("ambiguous commits", f"{s.ambiguous_commits}" + "".join(
        f"\n  {k}: {v}" for k, v in s.ambiguous_resolutions.items()))  # fmt: skip
    table.add_row("recoveries (pull-and-diff)", f"{s.recoveries}, {s.recovered_rows} rows applied")
    table.add_row("epochs replayed from the expected state", str(s.replayed_epochs))
    table.add_row("drift: missing / extra / changed", f"{s.missing} / {s.extra} / {s.changed}")
    src = s.source_check
    table.add_row(
        "against TPC-H itself",
        f"{src['lineitem_rows']} of {src['lineitem_expected']} lines, "
        f"{src['lineitem_duplicates']} duplicated, {src['rows_without_epoch']} without epoch; "
        f"{src['customers_wrong']} of {src['customers_expected']} customer totals wrong",
    )
    lat = s.latency_ms
    table.add_row(
        "event-to-visible latency",
        "n/a (track_commit_timestamp is off)" if lat["p50"] is None else
        f"p50 {_seconds(lat['p50'])}, p95 {_seconds(lat['p95'])}, p99 {_seconds(lat['p99'])} "
        f"({lat['rows']} rows)",
    )  # fmt: skip
    table.add_row("verified", "[green]yes[/]" if s.verified else "[red]NO[/]")
    Console().print(table)
