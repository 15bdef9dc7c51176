"""The latency benchmark's report: the targets judged, the Markdown, the latency CDF plot.

Everything here is drawn from the report's JSON alone (``python -m
benchmarks.latency --plot-only`` redraws the plot from a saved report), so
that what the Markdown and the plot say comes from the run's own data: the
kills that fired, whether it was a quick run, which runs each panel holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "HEADLINE_TRIGGER",
    "QUANTILES",
    "cdf_quantiles",
    "judge_headline",
    "markdown",
    "plot",
    "ratio",
    "sustainable",
    "targets",
]

# The CDF kept in the JSON: each run's latency at these fractions of its rows
# (0, 0.5 %, ..., 100 %), enough to redraw the plot without the raw rows.
QUANTILES = np.linspace(0.0, 1.0, 201)

# The trigger interval the headline figures are quoted at.
HEADLINE_TRIGGER = 1.0


def sustainable(result: dict[str, Any], interval: float) -> tuple[bool, str]:
    """Whether the at-least-once run kept up with one file per ``interval``, and why (not)."""
    ms = interval * 1000
    batch = result.get("batch_ms_p95")
    growth = result.get("latency_growth_ms")
    if batch is None or growth is None:
        return False, "no batch figures"
    if batch >= ms:
        return False, f"batch p95 {batch} ms >= the {ms:g} ms interval"
    if growth >= ms:
        return False, f"latency grew {growth} ms over the run (>= one interval)"
    return True, f"batch p95 {batch} ms < {ms:g} ms; latency growth {growth} ms < {ms:g} ms"


def judge_headline(report: dict[str, Any]) -> None:
    """Whether at-least-once kept up at 1 s too (when no shorter candidate did, 1 s is used)."""
    found = report["by_trigger"].get(f"{HEADLINE_TRIGGER:g}", {}).get("at_least_once")
    if found is not None:
        ok, why = sustainable(found, HEADLINE_TRIGGER)
        report["calibration"]["at_1s"] = {"sustained": ok, "why": why}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def targets(by_mode: dict[str, dict[str, Any]], exactly_once: list[str]) -> dict[str, Any]:
    """The targets, evaluated on the figures as measured."""
    alo, pd = by_mode["at_least_once"], by_mode["pull_and_diff"]
    p99_ratio = ratio(pd["p99_ms"], alo["p99_ms"])
    rate_ratio = ratio(pd["rows_per_s"], alo["rows_per_s"])
    found: dict[str, Any] = {
        "pull_and_diff_p99_vs_at_least_once": {
            "value": p99_ratio, "target": "<= 1.25",
            "pass": p99_ratio is not None and p99_ratio <= 1.25,
        },
        "pull_and_diff_rows_per_s_vs_at_least_once": {
            "value": rate_ratio, "target": ">= 0.8",
            "pass": rate_ratio is not None and rate_ratio >= 0.8,
        },
    }  # fmt: skip
    if "two_phase_30s" in by_mode:
        lower = ratio(by_mode["two_phase_30s"]["p99_ms"], pd["p99_ms"])
        found["two_phase_30s_p99_vs_pull_and_diff"] = {
            "value": lower, "target": ">= 20", "pass": lower is not None and lower >= 20,
        }  # fmt: skip
    bad = {
        name: {"duplicates": by_mode[name]["duplicates"], "missing": by_mode[name]["missing"]}
        for name in exactly_once
        if by_mode[name]["duplicates"] or by_mode[name]["missing"]
    }
    found["exactly_once_zero_duplicates_missing"] = {
        "value": bad or "all 0", "target": "0 in " + ", ".join(exactly_once), "pass": not bad,
    }  # fmt: skip
    return found


# -- the report ------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _ways(ways: dict[str, int] | None) -> str:
    return ", ".join(f"{way} {n}" for way, n in ways.items()) if ways else "-"


def cdf_quantiles(cdf: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, list[float]]]:
    """Each run's latencies (ms) as :data:`QUANTILES` of them, for the JSON (trigger -> mode)."""
    return {
        trigger: {
            mode: [round(float(x), 1) for x in np.quantile(values, QUANTILES)] if values else []
            for mode, values in by_mode.items()
        }
        for trigger, by_mode in cdf.items()
    }


QUICK_NOTE = (
    "**A quick run** (`python -m benchmarks --quick`): small sizes, to check that the benchmark "
    "still runs end to end. These are not figures to publish or compare."
)


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        "# Event-to-visible latency: at-least-once, two-phase commit, pull-and-diff",
        "",
        *([QUICK_NOTE, ""] if r.get("quick") else []),
        f"Run {r['when']} on {m['cpu_model']} ({m['cpus']} cores, {m['memory_gib']} GiB), "
        f"PostgreSQL {r['postgres']} (fsync on, track_commit_timestamp on), "
        f"pyspark {r['versions'].get('pyspark')} `{m['spark_master']}`. TPC-H scale "
        f"{r['scale']}: {r['lineitem_rows']:,} lineitem rows in {r['epochs']} files, one "
        "file per micro-batch, dropped one per trigger interval at a seeded point of it "
        f"(seed {r['seed']}, the same points for every mode; Spark's trigger fires on "
        "wall-clock multiples of the interval).",
        "",
        _load(r),
        "",
        f"Headline (trigger {r['headline_trigger_s']:g} s): latency, rows/s and CPU from the "
        "clean run, duplicates and missing from the "
        "crash run (where it ran; else the clean run).",
        "",
        "| mode | p50 ms | p95 ms | p99 ms | rows/s | CPU s | duplicates | missing |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, f in r["modes"].items():
        lines.append(
            f"| {name} | {_fmt(f['p50_ms'])} | {_fmt(f['p95_ms'])} | {_fmt(f['p99_ms'])} | "
            f"{_fmt(f['rows_per_s'])} | {_fmt(f['cpu_s'])} | {f['duplicates']} | "
            f"{f['missing']} |"
        )
    if "targets" in r:
        lines += ["", "## Targets (as measured)", "", "| target | value | pass |", "|---|---|---|"]
        for trigger, found in r["targets_by_trigger"].items():
            for name, t in found.items():
                if name == "exactly_once_zero_duplicates_missing" and trigger != _headline(r):
                    continue
                lines.append(f"| {name} ({t['target']}), trigger {trigger} s | {t['value']} | "
                             f"{'PASS' if t['pass'] else 'FAIL'} |")  # fmt: skip
        lines += ["", "The zero duplicates/missing target is taken from the crash runs."]
    for trigger, found in r["by_trigger"].items():
        lines += [
            "",
            f"## Trigger {trigger} s (clean runs)",
            "",
            "| mode | p50 ms | p95 ms | p99 ms | max ms | rows/s | latency growth ms | "
            "batch p50/p95 ms | driver CPU s | server CPU s | wall s | dup | missing |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, f in found.items():
            batch = (f"{_fmt(f.get('batch_ms_p50'))} / {_fmt(f.get('batch_ms_p95'))}"
                     if "batch_ms_p50" in f else "-")  # fmt: skip
            lines.append(
                f"| {name} | {_fmt(f['p50_ms'])} | {_fmt(f['p95_ms'])} | {_fmt(f['p99_ms'])} | "
                f"{_fmt(f['max_ms'])} | {_fmt(f['rows_per_s'])} | "
                f"{_fmt(f['latency_growth_ms'])} | {batch} | {_fmt(f['cpu_s'])} | "
                f"{_fmt(f['pg_cpu_s'])} | {_fmt(f['wall_s'])} | {f['duplicates']} | "
                f"{f['missing']} |"
            )
        for name, f in found.items():
            if "stage_ms_p50" in f:
                lines += ["", f"{name}'s batch (median ms): Spark's `addBatch` "
                          f"{_fmt(f.get('add_batch_ms_p50'))}, of which staging every sink "
                          f"{_fmt(f['stage_ms_p50'])} and the commit cycle "
                          f"{_fmt(f.get('commit_ms_p50'))}; sink-batches staged by way: "
                          f"{_ways(f.get('staged_via'))}."]  # fmt: skip
    if r["crash_runs"]:
        fired = {name: len(f["crashes"]) for name, f in r["crash_runs"].items() if "error" not in f}
        lines += [
            "",
            f"## Crash runs (trigger {r['crash_trigger_s']:g} s, {r['crash_epochs']} files)",
            "",
            "Each mode's process was killed with SIGKILL at its seeded points and restarted on "
            "the same checkpoint. Kills that fired: "
            + ", ".join(f"{name} {n}" for name, n in fired.items())
            + " (a point that a run does not reach before its last file does not fire).",
            "",
            "| mode | kills | settled s | resumed s | duplicates | missing "
            "| lines over / under counted | customers wrong | p99 ms |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, f in r["crash_runs"].items():
            if "error" in f:
                lines.append(f"| {name} | run failed: {f['error'][-200:]!r} | | | | | | | |")
                continue
            kills = f"{len(f['crashes'])}: {', '.join(f['crashes'])}" if f["crashes"] else "none"
            lines.append(
                f"| {name} | {kills} | {_seconds(f.get('settled_s'))} | "
                f"{_seconds(f.get('resumed_s'))} | {f['duplicates']} | "
                f"{f['missing']} | {f['lines_over_counted']} / {f['lines_under_counted']} | "
                f"{f['customers_wrong']} | {_fmt(f['p99_ms'])} |"
            )
        lines += _restart_table(r["crash_runs"])
    cal = r["calibration"]
    lines += ["", "## Method", ""]
    if "tried" in cal:
        lines.append(
            "Shortest sustainable trigger interval: the at-least-once pipeline was run at "
            + ", ".join(f"{c:g} s" for c in cal["candidates_s"])
            + " (shortest first, stopping at the first that passed), each with one file per "
            "interval; sustained = Spark's batch duration (triggerExecution) p95 below the "
            "interval and the per-file median latency growing by less than one interval from "
            "the first paced file to the last (a least-squares line). Results:"
        )
        for t in cal["tried"]:
            lines.append(f"- {t['interval_s']:g} s: {'sustained' if t['sustained'] else 'not'}"
                         f" ({t['why']})")  # fmt: skip
        if any(t["sustained"] for t in cal["tried"]):
            lines.append(f"Chosen: {cal['shortest_sustained_s']:g} s; the at-least-once run "
                         "at that interval is the calibration run itself.")  # fmt: skip
        else:
            lines.append("None of them was sustained, so 1 s is both the shortest interval "
                         "used and the headline one.")  # fmt: skip
        if "at_1s" in cal:
            verdict = "sustained" if cal["at_1s"]["sustained"] else "NOT sustained"
            lines.append(f"At 1 s the at-least-once run was {verdict} ({cal['at_1s']['why']}).")
    else:
        lines.append(f"Trigger intervals given: {cal['given']}.")
    lines += [
        "",
        "- Latency: a lineitem row's file mtime (renamed into the watched folder) to "
        "`pg_xact_commit_timestamp(xmin)` of the row, i.e. the commit that made it visible "
        "(for two-phase, the `COMMIT PREPARED` of a checkpoint). Warm-up: file 0 is dropped "
        "alone; the paced feed starts once its rows are visible; its rows are left out.",
        "- rows/s: the paced lineitem rows / (last row visible - first paced file's drop). "
        "With a paced feed this is bounded by the feed rate; it drops when rows wait.",
        "- driver CPU: utime+stime of the mode's process tree (driver Python, Spark JVM, "
        "Python workers), sampled from /proc every 0.2 s; server CPU: the PostgreSQL "
        "backends' CPU, from the postmaster's reaped-children time (approximate: it includes "
        "autovacuum workers and the parent's polling session).",
        "- two_phase_{C}s: each batch's transaction ends in `PREPARE TRANSACTION`; a "
        "checkpoint thread `COMMIT PREPARED`s every prepared batch each C s. Revenue deltas "
        "go into a side table in the prepared transaction and are folded into the totals "
        "at the checkpoint: adding them to the totals inside the prepared transaction locks "
        "the customers' rows until the checkpoint, and the next batch (sharing customers) "
        "would wait on those locks, one batch per checkpoint.",
        "- pull_and_diff: the demo pipeline (`reconcile.demo.tpch.pipeline`), unchanged. "
        "It warms its `orders` cache before its query starts; the other modes fill theirs "
        "in their first batch.",
        "- Crash points, as planned: at_least_once right after a batch's COMMIT (twice); "
        "two_phase after "
        "a PREPARE, then after a checkpoint's COMMIT PREPARED; pull_and_diff at "
        "`cycle.expected_state.recorded` and `pg.commit.returned`. Duplicates = duplicated "
        "lineitem rows + lines over-counted in `demo_customer_revenue` against TPC-H; missing "
        "= absent lineitem rows + lines under-counted.",
        "- Restarts, the same steps for every mode, each process logging its own "
        "(`benchmarks.latency.restart`), timed from the relaunch: **settled** = what the "
        "killed process left in doubt is in the sinks (two-phase: the restart's checkpoint "
        "`COMMIT PREPARED` the batches it had prepared, before Spark starts; pull-and-diff: "
        "the sinks brought to the newest decided epoch, while Spark starts; at-least-once: "
        "nothing to settle, a batch it wrote is written again); **resumed** = the first "
        "micro-batch the new process wrote is visible (its COMMIT; two-phase: the "
        "checkpoint's COMMIT PREPARED of a batch it prepared), Spark's start included for "
        "every mode.",
        "",
        "![latency CDF](latency_cdf.png)",
        "",
        _caption(r),
        "",
    ]
    return "\n".join(lines)


_STEP_NAMES = (("process_s", "process up"), ("settled_s", "settled"),
               ("spark_up_s", "Spark session up"), ("started_s", "query started"),
               ("first_commit_s", "first own batch visible (resumed)"))  # fmt: skip


def _restart_table(crash_runs: dict[str, Any]) -> list[str]:
    """Each relaunch's steps, in seconds from the relaunch (``-``: not a step of that mode)."""
    lines = [
        "",
        "Where each restart's time went (seconds from the relaunch to each step, logged by "
        "the process itself):",
        "",
        "| mode, restart | " + " | ".join(label for _, label in _STEP_NAMES) + " |",
        "|---" * (len(_STEP_NAMES) + 1) + "|",
    ]
    for name, f in crash_runs.items():
        for i, steps in enumerate(f.get("restart_steps", []), start=1):
            cells = " | ".join(_fmt(steps.get(key)) for key, _ in _STEP_NAMES)
            lines.append(f"| {name}, {i} | {cells} |")
    return lines


def _seconds(found: list[float] | None) -> str:
    """A crash run's restart times; a results file of a run before they were measured has none."""
    if found is None:
        return "not measured (an older run)"
    return ", ".join(_fmt(x) for x in found)


def _load(r: dict[str, Any]) -> str:
    """The load the run shared the machine with: load averages, and other processes' CPU."""
    runs = [f for found in r["by_trigger"].values() for f in found.values()]
    runs += [f for f in r["crash_runs"].values() if "error" not in f]
    others = [f["others_cpu_s"] for f in runs if f.get("others_cpu_s") is not None]
    wall = [f["wall_s"] for f in runs if f.get("others_cpu_s") is not None]
    text = (
        f"Load average (1, 5, 15 min) {r['machine'].get('load_average_at_start')} at the "
        f"start and {r.get('load_average_after')} at the end (the benchmark's own Spark "
        "driver keeps it near 2)."
    )
    if others:
        text += (
            f" Other processes (the benchmark's parent and the kernel included) used "
            f"{sum(others):,.1f} CPU-s over the {sum(wall):,.0f} s of the runs "
            f"({sum(others) / sum(wall):.2f} cores on average; {max(others):,.1f} CPU-s in "
            "the busiest run)."
        )
    return text


def _calibration_only(r: dict[str, Any]) -> dict[str, str]:
    """Trigger -> why, for the intervals where only the calibration run (at-least-once) ran."""
    tried = r.get("calibration", {}).get("tried", [])
    return {
        f"{t['interval_s']:g}": t["why"]
        for t in tried
        if not t["sustained"] and f"{t['interval_s']:g}" not in r.get("by_trigger", {})
    }


def _caption(r: dict[str, Any]) -> str:
    """What the CDF plot shows, panel by panel."""
    text = (
        "The plot: one panel per trigger interval, one curve per mode's clean run (no kills): "
        "the fraction of lineitem rows visible within a latency (log scale); further left "
        "is faster."
    )
    for trigger, why in _calibration_only(r).items():
        text += (
            f" The {trigger} s panel holds one curve: the calibration run of at_least_once, "
            f"which did not sustain that interval ({why}), so no other mode ran there."
        )
    return text


def _headline(r: dict[str, Any]) -> str:
    return f"{r['headline_trigger_s']:g}"


# One look per mode, the same in every panel: colour and line style both
# differ, so that curves that nearly coincide (at-least-once and
# pull-and-diff) can still be told apart, in print too.
_STYLES: dict[str, dict[str, Any]] = {
    "at_least_once": {"color": "tab:gray", "linestyle": "--", "linewidth": 2.2},
    "two_phase_1s": {"color": "tab:orange", "linestyle": "-."},
    "two_phase_5s": {"color": "tab:green", "linestyle": ":", "linewidth": 2.0},
    "two_phase_30s": {"color": "tab:red", "linestyle": (0, (5, 1, 1, 1, 1, 1))},
    "pull_and_diff": {"color": "tab:blue", "linestyle": "-", "linewidth": 1.4},
    "pull_and_diff_via_executors": {"color": "tab:purple", "linestyle": (0, (1, 1))},
}


def plot(r: dict[str, Any], out: Path) -> None:
    """Draw ``latency_cdf.png`` from the report's ``cdf_quantiles_ms`` (see :func:`cdf_quantiles`).

    Raises:
        KeyError: a report without the CDF (saved before it was kept in the JSON).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cdfs = r["cdf_quantiles_ms"]
    alone = _calibration_only(r)
    triggers = sorted(cdfs, key=float)
    fig, axes = plt.subplots(1, len(triggers), figsize=(6.5 * len(triggers), 5.2), squeeze=False)
    for ax, trigger in zip(axes[0], triggers, strict=True):
        for name, values in cdfs[trigger].items():
            if values:
                style = _STYLES.get(name, {"linestyle": "-"})
                ax.plot(values, np.linspace(0.0, 1.0, len(values)), label=name, **style)
        ax.set_xscale("log")
        ax.set_xlabel("event-to-visible latency (ms, log scale)")
        ax.set_ylabel("fraction of lineitem rows visible")
        title = f"Trigger {trigger} s, one file per trigger"
        if trigger in alone:
            title += "\ncalibration only: at-least-once did not keep up"
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right", title="clean run of", title_fontsize=8)
    heading = ["Event-to-visible latency CDF per write mode (left is faster)",
               f"run {r.get('when', '?')}"]  # fmt: skip
    if r.get("quick"):
        heading.insert(0, "QUICK RUN: small sizes, not figures to publish")
    fig.suptitle("\n".join(heading), fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "latency_cdf.png", dpi=110)
    plt.close(fig)
