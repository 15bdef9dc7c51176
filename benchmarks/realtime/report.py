"""The Real-Time Mode benchmark's targets, Markdown and plot (``benchmarks.realtime``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BASELINE",
    "P99_MS_TARGET",
    "P99_RATIO_TARGET",
    "ROWS_TARGET",
    "judge",
    "markdown",
    "plot",
]

BASELINE = "rtm_at_least_once"
P99_MS_TARGET = 100.0  # exactly-once p99 <= 100 ms
P99_RATIO_TARGET = 1.5  # and <= 1.5 x Real-Time Mode at-least-once's
ROWS_TARGET = 0.9  # rows/s >= 0.9 x at-least-once's


def _exactly_once(modes: dict[str, Any]) -> list[str]:
    return [m for m, x in modes.items() if x["kind"] == "rtm_exactly_once"]


def judge(r: dict[str, Any]) -> dict[str, Any]:
    """Each exactly-once Real-Time Mode setting against the targets (None: no figure)."""
    modes = r["modes"]
    base = modes.get(BASELINE, {})
    found: dict[str, Any] = {}
    for mode in _exactly_once(modes):
        x = modes[mode]
        t: dict[str, Any] = {}
        if "p99_ms" in x:
            t["p99_ms"] = x["p99_ms"]
            t["p99_ms_met"] = x["p99_ms"] <= P99_MS_TARGET
        if "p99_ms" in x and base.get("p99_ms"):
            t["p99_ratio"] = round(x["p99_ms"] / base["p99_ms"], 3)
            t["p99_ratio_met"] = t["p99_ratio"] <= P99_RATIO_TARGET
        if x.get("rows_per_s") and base.get("rows_per_s"):
            t["rows_per_s_ratio"] = round(x["rows_per_s"] / base["rows_per_s"], 3)
            t["rows_per_s_met"] = t["rows_per_s_ratio"] >= ROWS_TARGET
        found[mode] = t
    return found


def _verdict(t: dict[str, Any], key: str, text: str) -> str:
    if f"{key}_met" not in t:
        return "no figure (see the mode's error)"
    return f"{'met' if t[f'{key}_met'] else 'MISSED'} ({text})"


def _fmt(x: Any, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def markdown(r: dict[str, Any]) -> str:
    m, s, modes = r["machine"], r["scale"], r["modes"]
    out = [
        "# Kafka -> Spark Real-Time Mode -> PostgreSQL: exactly once against the alternatives",
        "",
    ]
    if r.get("quick"):
        out += ["**QUICK RUN: small sizes, a smoke test, not figures to publish.**", ""]
    out += [
        f"Run {r['when']} by `{r['command']}`, {r['took_s']:.0f} s. Machine: {m['cpu_model']}, "
        f"{m['cpus']} CPUs, {m['memory_gib']} GiB, {m['platform']}. Load average (1, 5, 15 "
        f"min) at start {m['load_average_at_start']}, at end {m['load_average_at_end']}: "
        f"{m['shared']}. One single-node KRaft broker and one PostgreSQL server (fsync on) on "
        f"the same machine; a topic of {s['partitions']} partitions and a Spark driver "
        f"({s['master']}) per mode, the modes one after another, each from a single run.",
        "",
        f"Load: {s['rate_per_s']:,.0f} records/s, {s['warmup_s']:g} s of warm-up (left out), "
        f"then {s['duration_s']:g} s measured. Latency: the record's Kafka CreateTime to the "
        "commit timestamp of the transaction that made its row visible. Rows/s: the measured "
        "rows over the time from the first one's production to the last one's visibility.",
        "",
        "## Targets",
        "",
    ]
    for mode, t in r["targets"].items():
        out += [
            f"- `{mode}` p99 <= {P99_MS_TARGET:g} ms: "
            + _verdict(t, "p99_ms", f"{_fmt(t.get('p99_ms'), 1)} ms"),
            f"- `{mode}` p99 <= {P99_RATIO_TARGET}x `{BASELINE}`'s: "
            + _verdict(t, "p99_ratio", f"{_fmt(t.get('p99_ratio'), 3)}x"),
            f"- `{mode}` rows/s >= {ROWS_TARGET}x `{BASELINE}`'s: "
            + _verdict(t, "rows_per_s", f"{_fmt(t.get('rows_per_s_ratio'), 3)}x"),
        ]
    out += [
        "",
        "## Per mode",
        "",
        "| mode | settings | rows/s | p50 ms | p90 ms | p99 ms | max ms | p50 first, last "
        "tenth ms | commits | producer rate/s (behind s) | duplicates | missing | load avg "
        "(1 min) start, end |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for mode, x in modes.items():
        settings = ", ".join(
            f"{k}={v}"
            for k, v in x.items()
            if k in ("rtm_batch", "rows_per_txn", "ms_per_txn", "trigger_s", "checkpoint_s")
        )
        p = x.get("producer", {})
        out.append(
            f"| {mode} | {settings} | {_fmt(x.get('rows_per_s'))} | {_fmt(x.get('p50_ms'))} | "
            f"{_fmt(x.get('p90_ms'))} | {_fmt(x.get('p99_ms'))} | {_fmt(x.get('max_ms'))} | "
            f"{_fmt(x.get('p50_first_tenth_ms'))}, {_fmt(x.get('p50_last_tenth_ms'))} | "
            f"{x['commits']:,} | {_fmt(p.get('achieved_rate_per_s'))} "
            f"({_fmt(p.get('max_behind_s'), 2)}) | {x['duplicates']:,} | {x['missing']:,}"
            f"{'' if x.get('drained') else ' (not all visible in time)'} | "
            f"{x['load_average_start'][0]}, {x['load_average_end'][0]} |"
        )
    problems = [(mode, x) for mode, x in modes.items() if x.get("error") or x.get("driver_error")]
    if problems:
        out += ["", "## Errors", ""]
        for mode, x in problems:
            out.append(f"- `{mode}`: {x.get('error') or ''} {(x.get('driver_error') or '')[-400:]}")
    out += [
        "",
        "`rtm_at_least_once` is a plain JVM `foreach` writer that inserts in transactions of "
        "the same bounds as the exactly-once writer's (`rows_per_txn`, `ms_per_txn`, a timer "
        "committing), without markers; with `rows_per_txn=1` (`--alo-rows-per-txn 1`) it "
        "inserts each row in its own autocommit transaction, one WAL flush a row. "
        "Duplicates: rows minus distinct record ids; the micro-batch modes' "
        "table has `id` as its key, so a replay there could not show as one. Missing: record "
        "ids produced but not in the table when the mode stopped (a mode not all visible in "
        "time was stopped after waiting 2 minutes, plus the warm-up and the duration and a "
        "checkpoint interval, past the last record: its missing rows were late, not necessarily "
        "lost). "
        "p50 first, last tenth: the median latency of the "
        "first and the last tenth of the measured records; a mode that does not keep up with "
        "the rate shows it growing. Producer rate: what the paced producer achieved over the "
        "measured records (behind s: how far it fell behind its schedule at worst).",
        "",
        "![latency CDF](realtime_cdf.png)",
        "",
    ]
    return "\n".join(out)


def plot(r: dict[str, Any], path: Path) -> None:
    """The modes' latency CDFs on one plot, log x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for mode, x in r["modes"].items():
        values = x.get("cdf_quantiles_ms")
        if values:
            clipped = np.maximum(np.asarray(values, dtype=float), 0.1)  # log axis: above 0
            ax.plot(clipped, np.linspace(0.0, 1.0, len(values)), label=mode)
    ax.set_xscale("log")
    ax.axvline(P99_MS_TARGET, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("event-to-visible latency (ms, log)")
    ax.set_ylabel("fraction of records visible")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    s = r["scale"]
    heading = [
        f"Kafka -> Spark -> PostgreSQL, {s['rate_per_s']:,.0f} records/s, "
        f"run {r['when']}, load at start {r['machine']['load_average_at_start']}"
    ]
    if r.get("quick"):
        heading.insert(0, "QUICK RUN: small sizes, not figures to publish")
    ax.set_title("\n".join(heading), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
