"""The Spark benchmark's report: the Markdown and ``spark_verify.png``, from its JSON alone.

``python -m benchmarks.spark --plot-only`` redraws the plot from a saved
report, so what the Markdown and the plot say comes from the run's own data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

READER_ROUNDS = 3  # rounds of the store readers side by side (benchmarks.spark)


def _readers(r: dict[str, Any]) -> list[str]:
    """The store readers side by side (reports from before they were measured have none)."""
    by = r.get("store_reader_s")
    if not by:
        return []
    return [
        "### The expected side: delta-spark or the version's file lists",
        "",
        f"The same verify, `local[2]` with 8 pull partitions, {READER_ROUNDS} rounds alternating "
        "the two readers (`spark_recover(..., store_reader=...)`), the fastest of each "
        f"(load average {r.get('load_average_1m', '?')} after them):",
        "",
        "| store reader | seconds |",
        "|---|---|",
        *(f"| `{reader}` | {s} |" for reader, s in by.items()),
        "",
        f"files / delta-spark: **{round(by['files'] / by['delta-spark'], 3)}** (above 1: "
        "delta-spark is faster).",
        "",
    ]


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        "# The engine on Spark",
        "",
        f"Run {r['when']} on {m['cpu_model']} ({m['cpus']} cores, {m['memory_gib']} GiB), "
        f"PostgreSQL {r['postgres']}, pyspark {r['versions'].get('pyspark')}.",
        "",
        f"## Full verify of {r['rows']:,} rows (no drift)",
        "",
        "| how | seconds |",
        "|---|---|",
        f"| in-process (COPY into Arrow, numpy hash) | {r['in_process_s']} |",
    ]
    for parts, s in r["local2_by_partitions_s"].items():
        lines.append(f"| Spark `local[2]`, {parts} pull partitions | {s} |")
    for workers, s in r["local_cluster_by_workers_s"].items():
        lines.append(f"| Spark `local-cluster`, {workers} worker(s), 2 partitions each | {s} |")
    lines += [
        "",
        f"In-process / best Spark `local[2]`: **{r['spark_vs_in_process_ratio']}** (above 1: "
        "Spark is faster). The rows above read the expected state with delta-spark, "
        "the default.",
        "",
        *_readers(r),
        f"## Streaming: {r['batches']} micro-batches of {r['batch_rows']:,} rows"
        + (
            f" (measured {r['streaming_when']}, before the verify above)"
            if r.get("streaming_when")
            else ""
        ),
        "",
        "| trigger | writer | rows/s | write p50 ms | write p95 ms | batch p50 ms | batch p95 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in r["streaming"]:
        lines.append(
            f"| {s['trigger']} | {s['mode']} | {s['rows_per_s']:,} | {s['add_batch_ms_p50']:.0f} "
            f"| {s['add_batch_ms_p95']:.0f} | {s['batch_ms_p50']:.0f} | {s['batch_ms_p95']:.0f} |"
        )
    lines += [
        "",
        "*write* is Spark's `addBatch` (the sink's work for the batch); *batch* is the whole "
        "micro-batch (`triggerExecution`). A row is visible in PostgreSQL when its batch's write "
        "ends: with the exactly-once writer, no checkpoint interval is added. *exactly_once*: "
        "the executors write the rows (a staging table and store change files; none passes "
        "through the driver), the default for a Postgres sink with an expected state; "
        "*exactly_once_via_driver*: the driver reads the staged files and writes them "
        '(`via="driver"`); *at_least_once*: a plain `foreachBatch` COPY of the batch.',
        "",
    ]
    return "\n".join(lines)


# How each streaming mode of the report stages its rows (``stream_once``); a
# mode not listed here is drawn under its own name.
_WRITERS = {
    "at_least_once": ("at-least-once: plain foreachBatch COPY", "tab:gray"),
    "exactly_once": ('exactly-once, via="executors"', "tab:blue"),
    "exactly_once_via_driver": ('exactly-once, via="driver"', "tab:orange"),
    "exactly_once_via_auto": ('exactly-once, via="auto" (the default)', "tab:green"),
}


def plot(r: dict[str, Any], out: Path) -> None:
    """Draw ``spark_verify.png`` from the report alone (``--plot-only`` redraws a saved one).

    Left, the full verify's seconds by how it ran. Right, the streaming
    write's time per micro-batch, grouped by trigger, one bar per writer (its
    p50, with a whisker to its p95), the writers named in the legend rather
    than under the bars, where their long names overlapped.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), width_ratios=(1, 1.3))
    labels = (
        ["in-process"]
        + [f"local[2] p={p}" for p in r["local2_by_partitions_s"]]
        + [f"cluster w={w}" for w in r["local_cluster_by_workers_s"]]
    )
    values = [r["in_process_s"], *r["local2_by_partitions_s"].values(),
              *r["local_cluster_by_workers_s"].values()]  # fmt: skip
    left.barh(labels, values, color=["tab:gray"] + ["tab:blue"] * (len(values) - 1))
    left.set_xlabel("seconds")
    left.set_title(f"Full verify of {r['rows']:,} rows")
    left.invert_yaxis()

    triggers = list(dict.fromkeys(s["trigger"] for s in r["streaming"]))
    modes = list(dict.fromkeys(s["mode"] for s in r["streaming"]))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        runs = {s["trigger"]: s for s in r["streaming"] if s["mode"] == mode}
        xs = [t + (i - (len(modes) - 1) / 2) * width for t in range(len(triggers))]
        p50 = [runs[t]["add_batch_ms_p50"] if t in runs else 0.0 for t in triggers]
        p95 = [runs[t]["add_batch_ms_p95"] if t in runs else 0.0 for t in triggers]
        label, color = _WRITERS.get(mode, (mode, None))
        right.bar(xs, p50, width * 0.9, label=label, color=color,
                  yerr=[[0.0] * len(p50), [b - a for a, b in zip(p50, p95, strict=True)]],
                  capsize=4, error_kw={"elinewidth": 1})  # fmt: skip
    named = {"as_fast_as_possible": "trigger: as fast as possible",
             "processing_time_1s": "trigger: every 1 s"}  # fmt: skip
    right.set_xticks(range(len(triggers)), [named.get(t, t) for t in triggers])
    right.set_ylabel("ms per micro-batch (Spark's addBatch)")
    right.set_title(f"Streaming write, {r['batch_rows']:,} rows a batch: bar p50, whisker p95")
    top = max(s["add_batch_ms_p95"] for s in r["streaming"])
    right.set_ylim(0, top * 1.35)  # room above the whiskers for the legend and the note
    right.legend(fontsize=8, loc="upper right")
    if not any(m.endswith("via_auto") for m in modes):
        # The run predates via="auto", the writer's default: say what it measured.
        right.text(0.01, 0.98, 'via="auto", the writer\'s default now, was not measured\n'
                   "in this run (it predates it)",
                   transform=right.transAxes, va="top", fontsize=8, style="italic")  # fmt: skip
    fig.suptitle(f"The engine on Spark: run {r['when']} ({r['machine']['cpus']} cores)",
                 fontsize=11)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out / "spark_verify.png", dpi=110)
    plt.close(fig)
