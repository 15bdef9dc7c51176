"""The scale benchmark's report: the Markdown page and the plots, from its JSON alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.latency.report import ratio

__all__ = ["markdown", "plot"]


def _fig(r: dict[str, Any], key: str) -> str:
    m = r.get(key)
    if m is None:  # a step not run, and none carried (no earlier report at this scale)
        return "not run"
    if "skipped" in m:
        return f"skipped ({m['skipped']})"
    return f"{m['seconds']} s, peak RSS {m['peak_rss_mb']:,} MB"


def machine_text(m: dict[str, Any]) -> str:
    """A machine as the report names it: CPUs, model, memory, platform."""
    return f"{m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, {m['platform']}"


def _on(machine: dict[str, Any] | None, r: dict[str, Any]) -> str:
    """ " on <machine>" where a figure was measured elsewhere than this report's machine."""
    return f" on {machine_text(machine)}" if machine and machine != r["machine"] else ""


def _when(part: dict[str, Any], r: dict[str, Any]) -> str:
    at = part.get("when")
    return f" Measured {at}{_on(part.get('machine'), r)}." if at and at != r["when"] else ""


def _carried(v: dict[str, Any], r: dict[str, Any]) -> str:
    if "carried_when" not in v:
        return ""
    return (
        f" Only these steps were run then: {', '.join(v['steps_run'])}; the other figures are "
        f"carried from the run of {v['carried_when']}{_on(v.get('carried_machine'), r)} "
        "(the same scale)."
    )


def _verify(r: dict[str, Any]) -> list[str]:
    v = r["verify_60m"]
    if not v.get("measured", True):
        return [f"{v['why']}.", ""]
    return [
        f"TPC-H `lineitem` at scale {v['tpch_scale']}: **{v['rows']:,} rows**, 16 columns, "
        f"written into PostgreSQL (fsync on) through the Postgres sink in {v['epochs']} epochs, "
        f"with its expected state. Each figure is a fresh process; peak RSS is its own "
        f"(`VmHWM`). Full mode in parts of {v['chunk_rows']:,} rows.{_when(v, r)}"
        f"{_carried(v, r)}",
        "",
        "| what | result | target |",
        "|---|---|---|",
        f"| binary COPY-out of the table (the better of two) | {_fig(v, 'copy_out')} | |",
        f"| full verify, in parts | {_fig(v, 'full_in_parts')} | peak RSS <= 4 GiB |",
        f"| full verify, in memory | {_fig(v, 'full_in_memory')} | |",
        f"| `full_vs_copy_ratio` (COPY-out time / full verify time) | "
        f"**{v.get('full_vs_copy_ratio', 'not run')}** | >= 0.5 |",
        f"| buckets mode, first check (computes the summary) | {_fig(v, 'buckets_first')} | |",
        f"| buckets mode, with the kept summary | {_fig(v, 'buckets_kept_summary')} | |",
        f"| scoped recovery of {v.get('divergent_rows', 1000):,} divergent rows | "
        f"{_fig(v, 'scoped_divergent')} | |",
        f"| full verify, the same divergence | {_fig(v, 'full_divergent')} | |",
        f"| scoped / full | {v.get('scoped_vs_full_ratio', 'not run')} | |",
        *_spark_rows(v, r),
        "",
    ]


_READERS = {
    "files": ", the store read from the file lists the engine assembles",
    "delta-spark": ", the store read by delta-spark",
}


def _spark_rows(v: dict[str, Any], r: dict[str, Any]) -> list[str]:
    spark = v.get("spark", {})
    if "why" in spark:
        return [f"| the Spark verify job | {spark['why']} | |"]
    rows = []
    for job in spark.values():
        memory = job["peak_mb_driver"] + (job["peak_mb_executors"] or 0)
        reader = _READERS.get(job.get("store_reader", ""), "")
        if "load_before" in job:
            reader += f" (load average {job['load_before']} before, {job['load_after']} after)"
        if "when" in job:
            reader += f", measured {job['when']}{_on(job.get('machine'), r)}"
        rows.append(
            f"| the Spark verify job on `{job['master']}`, {job['partitions']} pull partitions"
            f"{reader} | {job['seconds']} s ({job['job_seconds']} s without Spark's start), peak "
            f"{memory:,.0f} MB over its processes | |"
        )
    return rows + _reader_ratios(spark)


def _reader_ratios(spark: dict[str, Any]) -> list[str]:
    """delta-spark's job time over the file lists', for each master that ran both in one run."""
    rows = []
    for key, job in spark.items():
        if job.get("store_reader") != "delta-spark" or "when" in job:
            continue
        files = spark.get(key.removesuffix("delta-spark") + "files", {})
        if "when" in files or "job_seconds" not in files:
            continue  # not measured beside it
        ratio = job["job_seconds"] / files["job_seconds"]
        rows.append(
            f"| the job's time with delta-spark / with the file lists, on `{job['master']}`, "
            f"side by side | **{ratio:.3f}** | |"
        )
    return rows


def _day(r: dict[str, Any]) -> list[str]:
    d = r["store_day"]
    if not d.get("measured", True):
        return [f"{d['why']}.", ""]
    return [
        f"{d['epochs']:,} epochs of {d['rows_per_epoch']} rows (half updates) on a 100,000-row "
        f"table, `maintain()` after each as a pipeline runs it, in {d['seconds']:,} s."
        f"{_when(d, r)}",
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
        *_day_trend(d),
        f"| time to open the store at the end | **{d['open_s']} s** | <= 1 s |",
        *_day_disk(d),
        *_day_merges(d),
        "",
    ]


def _day_merges(d: dict[str, Any]) -> list[str]:
    """The rows the merges wrote per row the epochs wrote (older reports have none)."""
    if d.get("write_amplification") is None:
        return []
    return [f"| rows the merges wrote, per row the epochs wrote | {d['write_amplification']} "
            f"({d['merge_rows_written']:,} rows in {d['merges']:,} merges) | |"]  # fmt: skip


def _day_trend(d: dict[str, Any]) -> list[str]:
    """The RSS slope after the first epochs (older reports have none)."""
    if d.get("rss_trend_mb_per_10k") is None:
        return []
    return [f"| RSS trend after the first epochs (least squares) | "
            f"{d['rss_trend_mb_per_10k']} MB per 10,000 epochs | no trend |"]  # fmt: skip


def _day_disk(d: dict[str, Any]) -> list[str]:
    """The disk used, split by why each file is kept where the run measured it."""
    split = d.get("disk_split_mb")
    if not split:
        return [f"| disk used | {d['disk_mb']:,} MB | |"]
    return [
        f"| disk used (the store's folder) | **{d['disk_mb']:,} MB** | <= 1,000 MB |",
        f"| of which: live {split['live']:,} MB, change files {split['change']:,} MB, "
        f"history {split['history']:,} MB, retained {split['retained']:,} MB, "
        f"log {split['log']:,} MB | vacuum's margin scaled to {d['margin_epochs']} epochs "
        "(ten minutes of a day at one epoch a second) | |",
    ]


def _n(value: Any, fmt: str = ",") -> str:
    return "" if value is None else format(value, fmt)


def _stream(r: dict[str, Any]) -> list[str]:
    s = r["stream_sf1"]
    if not s.get("measured", True):
        return [f"{s['why']}.", ""]
    lines = [
        f"TPC-H at scale {s['tpch_scale']} ({s['lineitem_rows']:,} lines) through the demo "
        f"pipeline into both sinks (the lines, and the running revenue per customer), Spark "
        f"`{s['master']}`, no trigger interval: every file but the warm-up dropped at once, "
        f"one file per micro-batch. rows/s is from the drop to the commit of the last line "
        f"(the warm-up file's lines left out); batch is Spark's whole micro-batch; memory is "
        f"the peak sum of PSS over the driver's processes (its Python and JVM; in local mode "
        f"the JVM also runs the executors' tasks) and over the Python workers and executor "
        f"JVMs.{_when(s, r)}",
        "",
        "| lines a batch | mode | rows/s | vs at-least-once | batch p50 ms | batch p99 ms "
        "| driver MB | executors MB | staged via |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for runs in s["by_batch_rows"].values():
        alo = runs["at_least_once"]["rows_per_s"]
        for mode in ("at_least_once", "pull_and_diff", "pull_and_diff_via_executors",
                     "two_phase_30s"):  # fmt: skip
            m = runs.get(mode)
            if m is None:
                continue
            vs_alo = ratio(m["rows_per_s"], alo)
            via = ", ".join(f"{k} {v}" for k, v in (m.get("staged_via") or {}).items())
            lines.append(
                f"| {runs['rows_per_file']:,} | {mode} | {_n(m['rows_per_s'], ',.0f')} | "
                f"{_n(vs_alo)} | {_n(m['batch_ms_p50'])} | {_n(m['batch_ms_p99'])} | "
                f"{_n(m['peak_mb_driver'])} | {_n(m['peak_mb_executors'])} | {via} |"
            )
    lines += [
        "",
        f"- `eo_vs_alo_rows_per_s_min` (pull-and-diff, auto): "
        f"**{r['eo_vs_alo_rows_per_s_min']}** (target >= 0.9)",
        f"- `executors_vs_alo_rows_per_s_min`: **{r['executors_vs_alo_rows_per_s_min']}** "
        f"(target >= 0.8)",
        "",
    ]
    return lines


def markdown(r: dict[str, Any]) -> str:
    return "\n".join([
        "# Scale: streaming at saturation, a full verify in bounded memory, a day of epochs",
        "",
        f"Machine: {machine_text(r['machine'])}; "
        f"{r['when']}.{' A `--quick` smoke run: not figures to publish.' if r['quick'] else ''}",
        "",
        "## Streaming at saturation (`stream_sf1`)",
        "",
        *_stream(r),
        "## Full verify (`verify_60m`)",
        "",
        *_verify(r),
        "## A day of epochs (`store_day`)",
        "",
        *_day(r),
    ])  # fmt: skip


def plot(r: dict[str, Any], out: Path) -> None:
    """``scale_verify.png`` (time and memory by way) and ``scale_store_day.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if r["stream_sf1"].get("measured", True):
        _plot_stream(r["stream_sf1"], out)
    v, d = r["verify_60m"], r["store_day"]
    if not v.get("measured", True) or not d.get("measured", True):
        return
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


def _plot_stream(s: dict[str, Any], out: Path) -> None:
    """``scale_stream.png``: rows/s and peak memory by mode, a group per batch size."""
    import matplotlib.pyplot as plt

    sizes = list(s["by_batch_rows"])
    modes = ["at_least_once", "pull_and_diff", "pull_and_diff_via_executors", "two_phase_30s"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        xs = [j + i * width for j in range(len(sizes))]
        runs = [s["by_batch_rows"][size].get(mode, {}) for size in sizes]
        left.bar(xs, [m.get("rows_per_s") or 0 for m in runs], width, label=mode)
        right.bar(xs, [(m.get("peak_mb_driver") or 0) + (m.get("peak_mb_executors") or 0)
                       for m in runs], width, label=mode)  # fmt: skip
    labels = [f"{s['by_batch_rows'][size]['rows_per_file']:,} lines a batch" for size in sizes]
    for ax, title in ((left, "rows/s"), (right, "peak memory, driver + executors (MB)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], labels)
        ax.set_title(title)
    left.legend(fontsize=8)
    fig.suptitle(f"TPC-H scale {s['tpch_scale']} through the demo pipeline, as fast as it goes")
    fig.tight_layout()
    fig.savefig(out / "scale_stream.png", dpi=110)
    plt.close(fig)
