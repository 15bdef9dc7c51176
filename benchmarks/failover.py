"""Failover benchmark: how long a hot standby takes to lead, and whether any row is lost or doubled.

``python -m benchmarks.failover [--failovers 10] [--fault kill|pause|mixed] [--term 2]
[--out DIR]`` runs the TPC-H demo pipeline as a main and a standby
(``reconcile.demo.tpch.failover``) on an embedded Postgres, faults the leader
``--failovers`` times, and writes ``failover.json``, ``failover.md`` and
``failover.png`` (takeover time of each failover):

- ``takeover_p50_s`` / ``takeover_p95_s``: from the fault (SIGKILL, the
  named kill point, or SIGSTOP) to the commit of the first marker of the new
  leader's generation, read from Postgres;
- ``max_gap_ms``: the longest event-to-visible latency of a row whose file
  was dropped during a failover (a consumer's longest wait);
- ``duplicates`` / ``missing``: against the expected state (pull-and-diff,
  full, dry run) and against TPC-H itself (every line once, exact totals).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.report import RESULTS, machine, now, versions, write_report

__all__ = ["main"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.failover", description=__doc__)
    p.add_argument("--failovers", type=int, default=10)
    p.add_argument("--fault", choices=("kill", "pause", "mixed"), default="mixed")
    p.add_argument("--term", type=float, default=2.0, help="lease term, seconds")
    p.add_argument("--scale", type=float, default=0.01)
    p.add_argument("--epochs", type=int, default=0, help="files (default: enough to last)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between files")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    return p


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def markdown(report: dict[str, Any]) -> str:
    r = report
    lines = [
        "# Failover: a main and a hot standby of the TPC-H demo pipeline",
        "",
        f"Measured {r['when']} on {r['machine']['cpus']} cores "
        f"({r['machine']['cpu_model']}); TPC-H scale {r['scale']}, {r['epochs']} files "
        f"dropped every {r['interval_s']} s, lease term {r['term_s']} s, faults: {r['fault']}.",
        "",
        "Takeover: from the fault (SIGKILL, the kill file of a process killed at a named point, "
        "or SIGSTOP) to Postgres's commit time of the first epoch the new leader committed of "
        "its own. Each fault waits until the other process is a warm standby (it logged "
        "`ready`); a killed process is started again once the new leader has committed, so "
        "that its start-up does not share the cores with the takeover, as it would not on "
        "hosts of their own.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| failovers | {r['failovers']} |",
        f"| takeover p50 | {r['takeover_p50_s']} s |",
        f"| takeover p95 | {r['takeover_p95_s']} s |",
        f"| takeover max | {r['takeover_max_s']} s |",
        f"| longest row wait during a failover | {r['max_gap_ms']} ms |",
        f"| duplicates | {r['duplicates']} |",
        f"| missing | {r['missing']} |",
        f"| paused mains that wrote after the fault | {r['zombie_writes']} |",
        f"| verified | {r['verified']} |",
        "",
        "| # | fault | takeover s | old generation | new generation |",
        "|---|---|---|---|---|",
    ]
    for i, f in enumerate(r["runs"]):
        took = f"{f['takeover_s']:.2f}" if f["takeover_s"] is not None else "-"
        lines.append(
            f"| {i} | {f['fault']} | {took} | {f['old_generation']} | {f['new_generation']} |"
        )
    target = r["targets"]
    lines += ["", f"Target: takeover p95 <= 5 s with a 2 s lease: **{target['p95_le_5s']}**; "
              f"zero duplicates and missing: **{target['exact']}**."]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    took = [f["takeover_s"] for f in report["runs"] if f["takeover_s"] is not None]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(range(len(took)), took, color="tab:blue")
    ax.axhline(5, color="tab:red", linestyle="--", label="target p95 5 s")
    ax.set_xlabel("failover")
    ax.set_ylabel("takeover, s")
    ax.set_title(f"Takeover time, lease term {report['term_s']} s ({report['fault']} faults)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "failover.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from reconcile.demo.embedded_pg import start_server
    from reconcile.demo.tpch.failover import FailoverOptions, run_failovers

    epochs = args.epochs or max(40, 20 * args.failovers)
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="reconcile-failover-") as folder,
        start_server(track_commit_timestamp="on") as server,
    ):
        run = run_failovers(FailoverOptions(
            Path(folder) / "run", str(server.dsn()), failovers=args.failovers,
            fault=args.fault, seed=args.seed, scale=args.scale, epochs=epochs,
            interval=args.interval, term_s=args.term, timeout_s=3600,
        ))  # fmt: skip
    summary = run.summary
    assert summary is not None
    took = sorted(f.takeover_s for f in run.failovers if f.takeover_s is not None)
    source = summary.source_check
    distinct = int(source["lineitem_rows"]) - int(source["lineitem_duplicates"])
    duplicates = summary.extra + int(source["lineitem_duplicates"])
    missing = summary.missing + max(0, int(source["lineitem_expected"]) - distinct)
    p95 = _quantile(took, 0.95)
    report: dict[str, Any] = {
        "when": now(),
        "machine": machine(),
        "versions": versions("pyspark", "deltalake", "psycopg"),
        "scale": args.scale,
        "epochs": epochs,
        "interval_s": args.interval,
        "term_s": args.term,
        "fault": args.fault,
        "failovers": len(run.failovers),
        "takeover_p50_s": round(_quantile(took, 0.5) or 0, 2) if took else None,
        "takeover_p95_s": round(p95, 2) if p95 is not None else None,
        "takeover_max_s": round(max(took), 2) if took else None,
        "max_gap_ms": round(run.max_latency_in_failover_ms or 0),
        "max_latency_ms": round(run.max_latency_ms or 0),
        "duplicates": duplicates,
        "missing": missing,
        "changed": summary.changed,
        "zombie_writes": sum(f.old_wrote_after for f in run.failovers),
        "verified": summary.verified,
        "processes": run.processes,
        "runs": [asdict(f) for f in run.failovers],
        "runtime_s": round(time.monotonic() - started, 1),
    }
    report["targets"] = {
        "p95_le_5s": p95 is not None and p95 <= 5.0 and args.term == 2.0,
        "exact": duplicates == 0 and missing == 0 and summary.verified,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_report("failover", report, markdown(report), args.out)
    plot(report, args.out)
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
