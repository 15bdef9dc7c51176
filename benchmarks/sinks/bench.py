"""The sink benchmarks, one command: every sink measured alike in one run, PostgreSQL beside each.

``python -m benchmarks.sinks [--only PART ...] [--small-epochs N] [--big-rows N] [--out DIR]``

Each part is a module (``benchmarks/sinks/<part>.py``) with ``run(small_epochs,
big_rows)`` (through ``benchmarks/sink_harness.py``: the same table, the same
epochs, the same verify on every sink) and ``WRITE_PATH``, what its sink does
per epoch. A run measures the parts asked for, one after the other on this
machine, and keeps the others' figures from the last report; the ratios to
PostgreSQL are of figures measured in one run only when no ``--only`` was given
(the report says when each part was measured). Output:
``<out>/sinks.{json,md}`` and ``<out>/sinks.png``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.report import RESULTS, machine, now, versions, write_report

__all__ = ["PARTS", "bound", "main", "markdown"]

# part -> its module; PostgreSQL first, the reference.
PARTS = {
    "postgres": "benchmarks.sinks.postgres",
    "mariadb": "benchmarks.sinks.mariadb",
    "iceberg": "benchmarks.sinks.iceberg",
    "s3_files": "benchmarks.sinks.s3",
}
_PACKAGES = ("psycopg", "sqlalchemy", "PyMySQL", "pyiceberg", "boto3", "moto", "pyarrow",
             "deltalake")  # fmt: skip


def bound(figure: dict[str, Any]) -> str:
    """What a figure's wall time went to, from its client and server CPU seconds.

    A side busy most of the wall time bounds it; the two busy in turn, the
    round trips between them; neither busy means waits: on the disk (fsync),
    or on the network.
    """
    wall = max(figure["seconds"], 1e-9)
    client, server = figure["client_cpu_s"] / wall, figure["server_cpu_s"] / wall
    shares = f"client CPU {client:.0%}, server CPU {server:.0%} of the wall time"
    if client >= 0.6 and client >= server:
        return f"the client's CPU ({shares})"
    if server >= 0.6:
        return f"the server's CPU ({shares})"
    if client + server >= 0.6:
        return f"the two CPUs in turn, each waiting on the other's reply ({shares})"
    return f"waits: fsync or round trips ({shares})"


def _ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}" if reference else "n/a"


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: one table of every sink, the ratios to PostgreSQL, the bounds."""
    scale = report["scale"]
    parts = report["parts"]
    lines = [
        "# Sink benchmarks",
        "",
        f"Every sink writes the same table through the commit cycle's calls (stage, prepare, "
        f"commit): {scale['small_epochs']} small epochs of 100 new rows, then one big epoch of "
        f"{scale['big_rows']:,} new rows, then a full verify of the whole table against its "
        "expected state (no drift: every row pulled, hashed and diffed). Servers are "
        "throwaway instances on this machine, durable (fsync on); Iceberg runs in the "
        "benchmark's process; S3 is moto's server on 127.0.0.1. Single run, one part after "
        f"the other. Machine: {report['machine']['cpus']} CPUs, "
        f"{report['machine']['memory_gib']} GiB, load average "
        f"{report['machine'].get('load_average_at_start')} at the start.",
        "",
        "| sink | system | small epoch p50 / p95 (ms) | big epoch rows/s | full verify rows/s |",
        "|---|---|---|---|---|",
    ]
    for part in parts.values():
        small = part["small_epoch_commit"]
        lines.append(
            f"| {part['sink']} | {part['system']} | {small['p50_ms']} / {small['p95_ms']} | "
            f"{part['big_epoch']['rows_per_s']:,} | {part['full_verify']['rows_per_s']:,} |"
        )
    reference = parts.get("postgres")
    if reference is not None:
        lines += [
            "",
            "Beside PostgreSQL (each figure divided by PostgreSQL's; under 1 is slower):",
            "",
            "| sink | small epoch p50 speed | big epoch rows/s | full verify rows/s |",
            "|---|---|---|---|",
        ]
        for name, part in parts.items():
            if name == "postgres":
                continue
            # A latency's speed is the reference's time over this sink's time.
            small = _ratio(reference["small_epoch_commit"]["p50_ms"],
                           part["small_epoch_commit"]["p50_ms"])  # fmt: skip
            big = _ratio(part["big_epoch"]["rows_per_s"], reference["big_epoch"]["rows_per_s"])
            verify = _ratio(
                part["full_verify"]["rows_per_s"], reference["full_verify"]["rows_per_s"]
            )
            lines.append(f"| {part['sink']} | {small} | {big} | {verify} |")
    lines += ["", "## What bounds each sink", ""]
    for name, part in parts.items():
        small = part["small_epoch_commit"]
        per_epoch = bound({
            "seconds": small["wall_ms_mean"],
            "client_cpu_s": small["client_cpu_ms_mean"],
            "server_cpu_s": small["server_cpu_ms_mean"],
        })  # fmt: skip
        module = importlib.import_module(PARTS[name]) if name in PARTS else None
        lines += [
            f"**{part['sink']}** ({part['system']}; measured {part.get('measured_at')}): "
            f"{getattr(module, 'WRITE_PATH', '')}.",
            "",
            f"- small epoch (mean {small['wall_ms_mean']} ms): {per_epoch};",
            f"- big epoch: {bound(part['big_epoch'])};",
            f"- full verify: {bound(part['full_verify'])}.",
            "",
        ]
    lines.append("![the sinks side by side](sinks.png)")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """Four panels: small-epoch p50/p95, big-epoch and verify rows/s, the big epoch's CPU."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    parts = report["parts"]
    names = list(parts)
    x = np.arange(len(names))
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    small = [parts[n]["small_epoch_commit"] for n in names]
    axes[0].bar(x - 0.2, [s["p50_ms"] for s in small], 0.4, label="p50")
    axes[0].bar(x + 0.2, [s["p95_ms"] for s in small], 0.4, label="p95")
    axes[0].set_title("small epoch commit (ms, 100 rows)")
    axes[0].set_yscale("log")
    axes[0].legend()
    for ax, key, title in ((axes[1], "big_epoch", "big epoch (rows/s)"),
                           (axes[2], "full_verify", "full verify (rows/s)")):  # fmt: skip
        ax.bar(x, [parts[n][key]["rows_per_s"] for n in names], color="#336791")
        ax.set_title(title)
    walls = [max(parts[n]["big_epoch"]["seconds"], 1e-9) for n in names]
    client = [parts[n]["big_epoch"]["client_cpu_s"] / w for n, w in zip(names, walls, strict=True)]
    server = [parts[n]["big_epoch"]["server_cpu_s"] / w for n, w in zip(names, walls, strict=True)]
    axes[3].bar(x, client, label="client CPU", color="#c0765a")
    axes[3].bar(x, server, bottom=client, label="server CPU", color="#6a9f58")
    axes[3].axhline(1.0, color="grey", linewidth=0.8)
    top = max(c + s for c, s in zip(client, server, strict=True))
    axes[3].set_ylim(0, max(1.2, top) * 1.25)  # room for the legend above the bars
    axes[3].set_title("big epoch: CPU seconds per wall second")
    axes[3].legend(loc="upper left", ncols=2, fontsize="small")
    for ax in axes:
        ax.set_xticks(x, names, rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--small-epochs", type=int, default=200)
    parser.add_argument("--big-rows", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    path = args.out / "sinks.json"
    old: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    scale = {"small_epochs": args.small_epochs, "big_rows": args.big_rows}
    # Figures of another scale are not comparable: they are dropped, not kept.
    kept = old.get("parts", {}) if old.get("scale") == scale else {}
    report: dict[str, Any] = {
        "scale": scale,
        "machine": machine(load_average_at_start=[round(x, 2) for x in os.getloadavg()]),
        "versions": versions(*_PACKAGES),
        "parts": {},
    }
    for name in PARTS:
        if name not in args.only:
            if name in kept:
                report["parts"][name] = kept[name]
            continue
        print(f"sinks: measuring {name}", flush=True)
        part = importlib.import_module(PARTS[name]).run(args.small_epochs, args.big_rows)
        part["measured_at"] = now()
        part["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        report["parts"][name] = part
        print(json.dumps(part, indent=1), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(report, args.out / "sinks.png")
    write_report("sinks", report, markdown(report), out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
