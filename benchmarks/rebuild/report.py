"""The rebuild benchmark's report: the targets and whether each is met, a table, a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["markdown", "plot"]

LABELS = {
    "truncate_reload": "truncate and reload",
    "side_table_swap": "side-table swap",
    "rebuild": "rebuild by diff",
}

HOW = {
    "truncate_reload": "one transaction: TRUNCATE, then a CSV COPY of every row of the new "
    "logic into the table with its primary key",
    "side_table_swap": "a new table without a key, a CSV COPY of every row, ADD PRIMARY KEY, "
    "then one transaction renames the old table away and the new one in and drops the old",
    "rebuild": "`reconcile.rebuild.rebuild`: take over as the pipeline's writer (a new "
    "generation, the sink fenced), bring the sink to the newest decided epoch while the new "
    "state is hashed and compared by key with the store's keys and stored row hashes (the "
    "plan), commit the difference into the store's file of that epoch in one fenced Delta "
    "commit, apply the same difference to the sink in bounded fenced transactions, and "
    "switch the pipeline to the new logic version",
}


def _met(value: float, target: float) -> str:
    if value <= target:
        return f"**met** ({value:.3g} <= {target})"
    return f"**not met** ({value:.3g} > {target})"


def _steps(figures: dict[str, Any]) -> str:
    steps = figures["steps_s"]
    total = figures["seconds"] or 1.0
    return ", ".join(f"{name} {s:.2f} s ({100 * s / total:.0f} %)" for name, s in steps.items())


def _profile(profile: dict[str, Any] | None) -> list[str]:
    if not profile or not profile["samples"]:
        return []
    lines = [
        "",
        f"Where the rebuild's client time went (py-spy, {profile['samples']:,} samples at "
        f"{profile['rate_hz']} Hz, so about {profile['samples'] / profile['rate_hz']:.1f} s "
        "of a Python thread running: py-spy leaves out the samples where a thread waits, on "
        "Arrow's or Delta's own threads, on a disk or on the server. A call into C++ or Rust "
        "that runs on the calling thread counts on the Python function that made it; "
        "`rebuild_profile.txt` has the stacks):",
        "",
        "| function | on the stack | innermost |",
        "|---|---|---|",
    ]
    itself = dict(profile["self"])
    for function, share in profile["inclusive"]:
        own = itself.get(function)
        lines.append(f"| `{function}` | {100 * share:.0f} % | "
                     f"{'' if own is None else f'{100 * own:.0f} %'} |")  # fmt: skip
    innermost = ", ".join(f"`{f}` {100 * share:.0f} %" for f, share in profile["self"][:8])
    return [*lines, "", f"Innermost frames: {innermost}."]


def _load(machine: dict[str, Any]) -> list[str]:
    load = machine.get("load_avg_1m_before_after")
    if not load:
        return []
    return [f"- The machine is shared: the load average (1 min) was {load[0]} before the "
            f"run and {load[1]} after it."]  # fmt: skip


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: targets first, then each method's figures and where its time went."""
    scale = report["scale"]
    methods = report["methods"]
    by = methods["rebuild"]
    targets = report["targets"]
    lines = [
        "# Rebuild: bringing a sink table to new logic",
        "",
        f"{scale['rows']:,} rows in `bench_rows (k bigint PRIMARY KEY, v bigint, w text, "
        f"_epoch bigint)`, written through the engine in {scale['setup_epochs']} epochs; the "
        f"new logic changes `v` of {scale['changed_rows']:,} rows (every "
        f"{scale['every_nth_key']}th key, {100 * scale['changed_fraction']:g} %). PostgreSQL "
        f"{report['machine'].get('postgres', '?')}, fsync and full-page writes on; "
        f"{report['machine']['cpus']} CPUs ({report['machine']['cpu_model']}), "
        f"{report['machine']['memory_gib']} GiB. Measured {report['when']}.",
        "",
        f"The rebuild was `{by['call']}`, {by['part_rows']:,} rows per transaction.",
        "",
        "## Targets",
        "",
        "| target | figure | |",
        "|---|---|---|",
        f"| rows the rebuild wrote / rows the new logic changed <= "
        f"{targets['rows_written_vs_changed']} | {by['rows_written']:,} / "
        f"{scale['changed_rows']:,} = {report['rows_written_vs_changed']:.3f} | "
        f"{_met(report['rows_written_vs_changed'], targets['rows_written_vs_changed'])} |",
        f"| rebuild wall time / truncate-and-reload wall time <= "
        f"{targets['time_vs_truncate_reload']} | {by['seconds']:.2f} s / "
        f"{methods['truncate_reload']['seconds']:.2f} s = "
        f"{report['time_vs_truncate_reload']:.3f} | "
        f"{_met(report['time_vs_truncate_reload'], targets['time_vs_truncate_reload'])} |",
        "",
        "## The three methods",
        "",
        "| method | wall s | client CPU s | server CPU s | rows written | longest read gap s | "
        "reads failed | reads that found no row | sink holds the new logic |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in methods.items():
        reader = m["reader"]
        lines.append(
            f"| {LABELS[name]} | {m['seconds']:.2f} | {m.get('client_cpu_s', 0):.2f} | "
            f"{m.get('server_cpu_s', 0):.2f} | {m['rows_written']:,} | "
            f"{reader['longest_gap_s']:.3f} | {sum(reader['failed'].values()):,} of "
            f"{reader['reads']:,} | {reader['missing']:,} | {m['sink_matches_new_logic']} |"
        )
    lines += ["", "## Where each method's time went", ""]
    for name, m in methods.items():
        written = "; ".join(
            f"`{table}` {', '.join(f'{k} {v:,}' for k, v in rises.items() if v)}"
            for table, rises in m["rows_written_by_table"].items()
        )
        lines += [f"- **{LABELS[name]}**: {HOW[name]}. Steps: {_steps(m)}. "
                  f"Rows written: {written or 'none'}."]  # fmt: skip
    plan = by["plan"]
    lines += [
        "",
        f"The rebuild's plan: {plan['inserts']:,} inserts, {plan['updates']:,} updates, "
        f"{plan['deletes']:,} deletes; {by['applied']:,} rows applied in {by['parts']:,} "
        f"transaction(s) of at most {by['part_rows']:,} rows; the rebuild ended at step "
        f"`{by['step']}`.",
        *_profile(by.get("profile")),
        "",
        "## How it was measured",
        "",
        "- Each method starts from the same old-logic table (the rebuild first, on the table "
        "the engine wrote; the table is then reloaded by COPY for each of the others), after "
        "`VACUUM (ANALYZE)` and a `CHECKPOINT`. The new logic's Arrow table is computed before "
        "the clock starts, for all three.",
        f"- Rows written: {report['statistics']}. Temporary tables are not counted.",
        "- The reader: a process of its own (a thread would count this process's own Python "
        "work as the table's pauses) on its own connection, `SELECT k, v FROM bench_rows "
        "WHERE k = $1` for a random key every 5 ms with `lock_timeout` 50 ms and "
        "`statement_timeout` 200 ms; the longest gap is between two reads that found their "
        "row, from before the method starts until after it ends. A failed read is a lock or "
        "statement timeout (by SQLSTATE in the JSON). A gap without failed reads was no lock "
        "(a lock fails a read after 50 ms): the reader waited for a CPU, or its reads were slow.",
        "- CPU: this process's (the client's: every thread, C++ and Rust included) and the "
        "PostgreSQL server's processes' (from `/proc`; the reader's backend is among them).",
        *_load(report["machine"]),
        "- Whether the sink holds the new logic is read from the server after each method: "
        "every key once, each row with the new logic's values.",
        "",
        "Run: `python -m benchmarks.rebuild` (`--quick` for a check that it runs).",
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], out: Path) -> None:
    """``rebuild.png``: rows written (log scale), wall time and the longest read gap per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["methods"])
    methods = [report["methods"][n] for n in names]
    labels = [LABELS[n].replace(" ", "\n", 1) for n in names]
    colors = ["tab:gray", "tab:orange", "tab:blue"][: len(names)]
    panels = [
        ("rows written", [m["rows_written"] for m in methods], True),
        ("wall time, s", [m["seconds"] for m in methods], False),
        ("longest read gap, s", [max(m["reader"]["longest_gap_s"], 1e-3) for m in methods], True),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
    for ax, (title, values, log) in zip(axes, panels, strict=True):
        bars = ax.bar(labels, values, color=colors)
        ax.bar_label(
            bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.3g}" for v in values], fontsize=8
        )
        if log:
            ax.set_yscale("log")
            ax.set_ylim(min(values) / 10, max(values) * 5)  # the smallest bar stays visible
        ax.set_title(title)
        ax.tick_params(axis="x", labelsize=8)
    changed = report["scale"]["changed_rows"]
    axes[0].axhline(changed, color="tab:red", linestyle="--", label=f"changed rows {changed:,}")
    axes[0].legend(fontsize=8, loc="center left", framealpha=0.9)
    fig.suptitle(f"Bringing {report['scale']['rows']:,} rows to new logic "
                 f"({100 * report['scale']['changed_fraction']:g} % changed)")  # fmt: skip
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "rebuild.png", dpi=120)
    plt.close(fig)
