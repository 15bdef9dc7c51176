"""The recovery benchmark's report: the Markdown page and the plots, from its JSON alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["markdown", "plot"]


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        "# Pull-and-diff recovery on PostgreSQL",
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, "
        f"{m['platform']}; Python {m['python']}; PostgreSQL {r['postgres']} with fsync on "
        "(its own throwaway server). One run; every ratio from the same tables.",
        "",
        f"Table: `id bigint PRIMARY KEY, name text, qty int4, price float8, at timestamptz, "
        f"_epoch bigint` with an index on `_epoch` (what `create_epoch_column=True` creates); "
        f"{r['rows']:,} rows (and {r['small_rows']:,} for the size comparison).",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        "| `full_vs_copy_ratio` (raw COPY time / full verify time) | "
        f"**{r['full_vs_copy_ratio']}** "
        f"({r['full_verify_rows_per_s']:,} vs {r['raw_copy_rows_per_s']:,} rows/s) | >= 0.5 |",
        f"| `divergence_100_vs_full_ratio` (scoped / full, 100 rows) | "
        f"**{r['divergence_100_vs_full_ratio']}** | <= 0.05 |",
        f"| `buckets_vs_full_ratio` (100 hand-changed rows, the summary kept by the check "
        f"before) | **{r['buckets_vs_full_ratio']}** "
        f"({r['hand_changed']['buckets_s']}s vs {r['hand_changed']['full_s']}s, same counts) "
        "| < 1 |",
        f"| buckets, the next check one epoch (1,000 rows) later: summary brought forward "
        f"/ full | {r['buckets_forward_vs_full_ratio']} ({r['next_epoch']['buckets_s']}s vs "
        f"{r['next_epoch']['full_s']}s, same counts) | |",
        f"| buckets, the check after the divergence runs (a fifth of the rows changed: "
        f"summary computed again) | {r['hand_changed']['buckets_after_divergence_runs_s']}s | |",
        f"| buckets, first check ever (no summary: every expected row checksummed) / full | "
        f"{r['buckets_cold_vs_full_ratio']} ({r['buckets_cold_s']}s vs {r['full_verify_s']}s) "
        "| |",
        f"| `vs_reladiff_speedup` (reladiff hashdiff / full verify) | "
        f"**{r['vs_reladiff_speedup']}** ({r['reladiff']['hashdiff_s']}s vs "
        f"{r['reladiff']['full_verify_s']}s, same counts {r['reladiff']['counts']}) | > 1 |",
        "",
        "## Recovery time against divergence and sink size (after a crash, repair included)",
        "",
        "| sink rows | divergent rows | full (s) | scoped (s) | scoped / full "
        "| rows pulled (scoped) |",
        "|---|---|---|---|---|---|",
    ]
    for row in r["divergence"]:
        lines.append(
            f"| {row['sink_rows']:,} | {row['divergence']:,} | {row['full_s']} | "
            f"{row['scoped_s']} | {row['scoped_vs_full']} | {row['scoped_pulled']:,} |"
        )
    lines += [
        "",
        "![recovery time against divergence](recovery_divergence.png)",
        "",
        "## Method",
        "",
        "- Raw COPY: `COPY t TO STDOUT (FORMAT BINARY)` read to the end by psycopg, best of 2.",
        "- Full verify: `reconcile.recover(mode='full', dry_run=True)`: the store's keys and "
        "hashes, "
        "the table pulled with COPY BINARY into Arrow (ADBC), hashed, diffed; best of 2.",
        "- Divergence: the store records an epoch the sink never got (half updates of existing "
        "keys, half new keys), then `recover(mode=..., after_crash=True)` repairs it "
        "(pull, diff, apply in one transaction with the markers). Full and scoped each get their "
        "own epoch of the same size on the same table.",
        "- Buckets: a first check in buckets mode right after the load (no summary kept: "
        "the expected side checksums every row); the divergence runs; a check (the summary "
        "is computed again: a fifth of the rows changed since); 100 rows changed by hand "
        "(`UPDATE ... SET price = price + 1`); then `recover(mode='buckets', dry_run=True)` "
        "and the same in full mode; then one more epoch of 1,000 rows reaches store and sink, "
        "and both modes run again (the summary is brought forward over it). Only the "
        "database scans the whole table when a summary is kept; the expected rows are read "
        "for the ranges that differ.",
        "- reladiff: `diff_tables(..., algorithm='hashdiff')` (reladiff "
        "defaults: bisection factor 32, threshold 16384, one thread) between the sink table and "
        "the expected state loaded into a plain table with the same primary key.",
    ]
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for size in sorted({row["sink_rows"] for row in r["divergence"]}):
        part = [row for row in r["divergence"] if row["sink_rows"] == size]
        xs = [row["divergence"] for row in part]
        ax.plot(xs, [row["full_s"] for row in part], "o--", label=f"full, {size:,} rows")
        ax.plot(xs, [row["scoped_s"] for row in part], "s-", label=f"scoped, {size:,} rows")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("divergent rows (missing or changed)")
    ax.set_ylabel("recovery time (s), repair included")
    ax.set_title("Pull-and-diff recovery after a crash")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "recovery_divergence.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = ["raw COPY", "full verify", "buckets (100 changed)", "reladiff hashdiff"]
    values = [
        r["raw_copy_s"],
        r["full_verify_s"],
        r["hand_changed"]["buckets_s"],
        r["reladiff"]["hashdiff_s"],
    ]
    ax.barh(names, values)
    ax.set_xlabel(f"seconds, {r['rows']:,} rows")
    ax.set_title("Finding drift in one table")
    fig.tight_layout()
    fig.savefig(out / "recovery_modes.png", dpi=110)
    plt.close(fig)
