"""What every part of the sink benchmarks measures, the same way on every sink.

One table ``bench_rows (k text key, v bigint)``, written through the sink as the
commit cycle drives it (stage, prepare, commit), with its expected state in a
store on local disk:

- small epochs: ``small_epochs`` epochs of 100 new rows each, stage + prepare +
  commit timed per epoch (p50, p95, the first tenth left out as warm-up);
- a big epoch: ``big_rows`` new rows in one epoch, rows/s;
- a full verify of the whole table against its expected state
  (``recover(..., mode="full", dry_run=True)``, which must find no drift),
  rows/s.

Beside each wall time, the CPU seconds the benchmark's own process spent
(client) and those the server's processes spent (server: PostgreSQL's or
MariaDB's backends, moto's process), read from ``/proc``: which of the two
is busy says what bounds the figure, a wait on neither says the disk (fsync)
or a round trip.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.expected_state import summary
from expected_state.store import ExpectedStateStore
from reconcile import recover
from reconcile.core.contract import OK, SinkTxnId, WriterIdentity
from reconcile.core.sink import TwoPhaseSink, bind_writer

__all__ = ["PIPELINE", "SCHEMA", "TABLE", "Cpu", "Part", "measure", "rows"]

TABLE = "bench_rows"
PIPELINE = "bench"
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def rows(first: int, count: int) -> pa.Table:
    """``count`` new rows from key number ``first``: ``k`` a 13-character text, ``v`` a number."""
    numbers = np.arange(first, first + count)
    return pa.table({"k": [f"k{n:012d}" for n in numbers], "v": numbers * 7}, schema=SCHEMA)


def _tree_cpu(roots: Iterable[int]) -> float:
    """CPU seconds of the processes under ``roots`` (and of their children already reaped)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # The command name may hold spaces: the fields start after its ')'.
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone while listed
        pid = int(entry)
        parents[pid] = int(fields[1])
        utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
        times[pid] = (utime + stime + cutime + cstime) / _TICK
    wanted = set(roots)
    total = 0.0
    for pid, cpu in times.items():
        ancestor = pid
        while ancestor > 1 and ancestor not in wanted:
            ancestor = parents.get(ancestor, 0)
        if ancestor in wanted:
            total += cpu
    return total


@dataclass(frozen=True)
class Cpu:
    """Counts wall, client CPU and server CPU seconds of a block of work.

    ``stop = cpu.start(); ...; figures = stop()``. ``servers`` are the pids
    whose process trees are the server's (none: an in-process sink).
    """

    servers: tuple[int, ...] = ()

    def start(self) -> Callable[[], dict[str, float]]:
        """Start counting; the returned call stops and gives the three figures."""
        # The server's baseline first: reading /proc is not the sink's time.
        server = _tree_cpu(self.servers) if self.servers else 0.0
        wall, client = time.perf_counter(), time.process_time()

        def stop() -> dict[str, float]:
            took = time.perf_counter() - wall
            used = time.process_time() - client
            served = (_tree_cpu(self.servers) - server) if self.servers else 0.0
            return {"seconds": took, "client_cpu_s": used, "server_cpu_s": served}

        return stop


@dataclass
class Part:
    """One sink to measure: how to open it, what its rows look like, how to verify it."""

    system: str
    sink: str
    open: Callable[[], TwoPhaseSink]
    verify_uri: str
    servers: tuple[int, ...] = ()
    # The rows as the sink takes them from a pipeline (an Arrow table, or dicts).
    shape: Callable[[pa.Table], Any] = field(default=lambda table: table)


def _rounded(figures: dict[str, float]) -> dict[str, float]:
    return {name: round(value, 3) for name, value in figures.items()}


def _epoch(sink: TwoPhaseSink, epoch: int, batch: Any) -> None:
    txn = SinkTxnId(PIPELINE, TABLE, epoch, 1)
    for step, outcome in (("stage", lambda: sink.stage(txn, batch)),
                          ("prepare", lambda: sink.prepare(txn)),
                          ("commit", lambda: sink.commit(txn))):  # fmt: skip
        got = outcome()
        if got != OK:
            raise RuntimeError(f"{txn}: {step} gave {got!r}")


def measure(part: Part, root: Path, small_epochs: int, big_rows: int) -> dict[str, Any]:
    """The three figures of ``part``, its store under ``root``."""
    store = ExpectedStateStore(str(root), PIPELINE, TABLE, ["k"], schema=SCHEMA)
    sink = part.open()
    bind_writer(sink, WriterIdentity(PIPELINE, "bench-log"))
    cpu = Cpu(part.servers)
    small: list[float] = []
    small_cpu: list[dict[str, float]] = []
    for epoch in range(small_epochs):
        batch = rows(epoch * 100, 100)
        store.apply(epoch, batch.append_column("_op", pa.array(["upsert"] * 100)))
        shaped = part.shape(batch)
        stop = cpu.start()
        _epoch(sink, epoch, shaped)
        small_cpu.append(stop())
        small.append(small_cpu[-1]["seconds"] * 1000)
    warm = small[max(1, small_epochs // 10) :]
    kept = small_cpu[max(1, small_epochs // 10) :]
    big = rows(small_epochs * 100, big_rows)
    store.apply(small_epochs, big.append_column("_op", pa.array(["upsert"] * big_rows)))
    shaped = part.shape(big)
    stop = cpu.start()
    _epoch(sink, small_epochs, shaped)
    big_cpu = stop()
    del shaped, big
    close = getattr(sink, "close", None)
    if close is not None:
        close()
    total = small_epochs * 100 + big_rows
    stop = cpu.start()
    report = recover(part.verify_uri, str(root), PIPELINE, TABLE, keys=["k"], mode="full",
                     dry_run=True)  # fmt: skip
    if report.drift or report.rows_pulled != total:
        raise RuntimeError(f"{part.sink}: verify pulled {report.rows_pulled} of {total} rows")
    verify_cpu = stop()
    return {
        "system": part.system,
        "sink": part.sink,
        "small_epoch_commit": {
            "rows": 100,
            **summary(warm),
            "wall_ms_mean": round(sum(warm) / len(warm), 2),
            "client_cpu_ms_mean": round(1000 * sum(c["client_cpu_s"] for c in kept) / len(kept), 2),
            "server_cpu_ms_mean": round(1000 * sum(c["server_cpu_s"] for c in kept) / len(kept), 2),
        },
        "big_epoch": {
            "rows": big_rows,
            "rows_per_s": round(big_rows / big_cpu["seconds"]),
            **_rounded(big_cpu),
        },
        "full_verify": {
            "rows": total,
            "rows_per_s": round(total / verify_cpu["seconds"]),
            **_rounded(verify_cpu),
        },
    }
