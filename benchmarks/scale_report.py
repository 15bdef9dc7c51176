"""The scale benchmark's report: the Markdown page and the plots, from its JSON alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["markdown", "plot"]


def _fig(r: dict[str, Any], key: str) -> str:
    m = r.get(key, {})
    if "skipped" in m:
        return f"skipped ({m['skipped']})"
    return f"{m['seconds']} s, peak RSS {m['peak_rss_mb']:,} MB"


def markdown(r: dict[str, Any]) -> str:
    m, v, d = r["machine"], r["verify_60m"], r["store_day"]
    lines = [
        "# Scale: a full verify in bounded memory, and a day of epochs",
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, {m['platform']}; "
        f"{r['when']}.{' A `--quick` smoke run: not figures to publish.' if r['quick'] else ''}",
        "",
        "## Full verify (`verify_60m`)",
        "",
        f"TPC-H `lineitem` at scale {v['tpch_scale']}: **{v['rows']:,} rows**, 16 columns, "
        f"written into PostgreSQL (fsync on) through the Postgres sink in {v['epochs']} epochs, "
        f"with its expected state. Each figure is a fresh process; peak RSS is its own "
        f"(`VmHWM`). Full mode in parts of {v['chunk_rows']:,} rows.",
        "",
        "| what | result | target |",
        "|---|---|---|",
        f"| binary COPY-out of the table (the better of two) | {_fig(v, 'copy_out')} | |",
        f"| full verify, in parts | {_fig(v, 'full_in_parts')} | peak RSS <= 4 GiB |",
        f"| full verify, in memory | {_fig(v, 'full_in_memory')} | |",
        f"| `full_vs_copy_ratio` (COPY-out time / full verify time) | "
        f"**{v['full_vs_copy_ratio']}** | >= 0.5 |",
        f"| buckets mode, first check (computes the summary) | {_fig(v, 'buckets_first')} | |",
        f"| buckets mode, with the kept summary | {_fig(v, 'buckets_kept_summary')} | |",
        f"| scoped recovery of {v['divergent_rows']:,} divergent rows | "
        f"{_fig(v, 'scoped_divergent')} | |",
        f"| full verify, the same divergence | {_fig(v, 'full_divergent')} | |",
        f"| scoped / full | {v['scoped_vs_full_ratio']} | |",
        f"| the Spark verify job | {v['spark']['why']} | |",
        "",
        "## A day of epochs (`store_day`)",
        "",
        f"{d['epochs']:,} epochs of {d['rows_per_epoch']} rows (half updates) on a 100,000-row "
        f"table, `maintain()` after each as a pipeline runs it, in {d['seconds']:,} s.",
        "",
        "| what | result | target |",
        "|---|---|---|",
        f"| commit + maintain, first {d['window']:,} epochs | "
        f"p50 {d['commit_first']['p50_ms']} ms, p95 {d['commit_first']['p95_ms']} ms | |",
        f"| commit + maintain, last {d['window']:,} epochs | "
        f"p50 {d['commit_last']['p50_ms']} ms, p95 {d['commit_last']['p95_ms']} ms | |",
        f"| last p95 / first p95 | **{d['last_p95_vs_first']}** | <= 1.2 |",
        f"| RSS at start, at end | {d['rss_start_mb']} MB, {d['rss_end_mb']} MB "
        f"(growth {d['rss_growth']:.1%}) | growth <= 10 % |",
        f"| time to open the store at the end | **{d['open_s']} s** | <= 1 s |",
        f"| disk used | {d['disk_mb']:,} MB | |",
        "",
        "## Streaming at saturation (`stream_sf1`)",
        "",
        f"{r['stream_sf1']['why']}.",
        "",
    ]
    return "\n".join(lines)


def plot(r: dict[str, Any], out: Path) -> None:
    """``scale_verify.png`` (time and memory by way) and ``scale_store_day.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    v, d = r["verify_60m"], r["store_day"]
    ways = [k for k in ("copy_out", "full_in_parts", "full_in_memory", "buckets_kept_summary",
                        "scoped_divergent") if "seconds" in v.get(k, {})]  # fmt: skip
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.barh(ways, [v[k]["seconds"] for k in ways], color="#4c72b0")
    left.set_xlabel("seconds")
    left.set_title(f"lineitem, {v['rows']:,} rows")
    right.barh(ways, [v[k]["peak_rss_mb"] for k in ways], color="#dd8452")
    right.set_xlabel("peak RSS (MB)")
    right.set_title("memory of each process")
    fig.tight_layout()
    fig.savefig(out / "scale_verify.png", dpi=110)
    plt.close(fig)

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    every = max(1, d["epochs"] // max(1, len(d["latency_ms_every"])))
    xs = [i * every for i in range(len(d["latency_ms_every"]))]
    top.plot(xs, d["latency_ms_every"], ".", markersize=2)
    top.set_ylabel("commit + maintain (ms)")
    top.set_title(f"a day of epochs: {d['epochs']:,} epochs of {d['rows_per_epoch']} rows")
    bottom.plot([e for e, _ in d["rss_over_time"]], [mb for _, mb in d["rss_over_time"]])
    bottom.set_ylabel("RSS (MB)")
    bottom.set_xlabel("epoch")
    fig.tight_layout()
    fig.savefig(out / "scale_store_day.png", dpi=110)
    plt.close(fig)
