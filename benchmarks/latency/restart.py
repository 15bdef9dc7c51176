"""The latency benchmark's restart timeline: each relaunch's steps, from the processes' own logs.

Every write mode's process appends the steps of its start to ``events.jsonl``
in its run folder (``reconcile.demo.tpch.events.EventLog``; the demo pipeline
for pull-and-diff, ``benchmarks.latency.modes`` for the others), under the
same names:

- ``process``: the interpreter is up and the process's own code runs;
- ``settled``: what the killed process left in doubt is in the sinks. For
  two-phase commit, the restart's checkpoint ``COMMIT PREPARED`` the batches it
  had prepared; for pull-and-diff, the sinks were brought to the newest decided
  epoch (the pull-and-diff, applied or finding nothing to apply).
  At-least-once has nothing to settle (a batch it wrote again is written twice)
  and logs no such step;
- ``spark_up``: the Spark session is up;
- ``started``: the streaming query is started;
- ``first_commit``: the first micro-batch that this process itself wrote is
  visible: its COMMIT returned (for two-phase, the checkpoint's COMMIT PREPARED
  of a batch this process prepared).

Each step is timed from the relaunch (the parent's clock, the same machine's
``time.time()``). Two of them are the restart's figures, the same for every
mode: ``settled_s`` (how long the rows of batches written before the kill
wait) and ``resumed_s`` = ``first_commit_s`` (how long the stream is stopped:
Spark's start, included for every mode). The first commit after the relaunch
is not a figure by itself: for two-phase it is the settling checkpoint, before
Spark starts; for a mode whose settling commits rows that later batches
overwrite, it is a later batch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["STEPS", "restart_steps"]

STEPS = ("process", "settled", "spark_up", "started", "first_commit")


def restart_steps(
    events: list[dict[str, Any]], launches: list[tuple[int, float]]
) -> list[dict[str, float | None]]:
    """Per relaunch (every launch but the first): seconds from it to each step of its process.

    Args:
        events: the run's event log (each with ``event``, ``t`` and ``pid``; a
            ``first_commit`` may carry ``at``, the engine's own commit time).
        launches: (pid, wall time) of each launch, the first one included.

    Returns:
        One dict per relaunch: ``<step>_s`` for each of :data:`STEPS` (None
        where the process did not reach it; ``settled_s`` among them), and
        ``resumed_s``, the same as ``first_commit_s``.
    """
    out: list[dict[str, float | None]] = []
    for pid, launched in launches[1:]:
        found: dict[str, float | None] = {}
        for step in STEPS:
            times = [
                float(e.get("at", e["t"]))
                for e in events
                if e.get("pid") == pid and e.get("event") == step
            ]
            found[f"{step}_s"] = round(min(times) - launched, 2) if times else None
        found["resumed_s"] = found["first_commit_s"]
        out.append(found)
    return out
