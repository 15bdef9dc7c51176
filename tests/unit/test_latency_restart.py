"""The latency benchmark's restart timeline: the same steps for every mode, from each process's log.

The events are as the processes write them (``reconcile.demo.tpch.events.EventLog``):
the demo pipeline for pull-and-diff, ``benchmarks.latency.modes`` for the others.
"""

from __future__ import annotations

from typing import Any

from benchmarks.latency.restart import STEPS, restart_steps


def event(name: str, t: float, pid: int, **fields: Any) -> dict[str, Any]:
    return {"event": name, "t": t, "pid": pid, **fields}


def test_two_phase_resumes_with_its_own_first_batch_not_with_the_settling_checkpoint() -> None:
    # Killed after a PREPARE: the restart's checkpoint commits that batch at once,
    # before Spark starts; the first batch of the new process is visible at the
    # checkpoint after its own PREPARE, once Spark runs.
    launches = [(100, 1000.0), (200, 1050.0)]
    events = [
        event("process", 1000.9, 100),
        event("settled", 1001.0, 100, batches=0),
        event("first_commit", 1020.0, 100),  # the killed process's own: not this restart's
        event("process", 1050.9, 200),
        event("settled", 1051.1, 200, batches=1),
        event("spark_up", 1064.0, 200),
        event("started", 1065.5, 200),
        event("first_commit", 1072.25, 200),
    ]
    [steps] = restart_steps(events, launches)
    assert steps["settled_s"] == 1.1
    assert steps["resumed_s"] == steps["first_commit_s"] == 22.25
    assert (steps["process_s"], steps["spark_up_s"], steps["started_s"]) == (0.9, 14.0, 15.5)


def test_each_step_is_the_first_in_its_process_with_the_engines_commit_time() -> None:
    launches = [(100, 1000.0), (200, 1050.0), (300, 1100.0)]
    events = [
        event("process", 1050.8, 200),
        event("spark_starting", 1050.9, 200),
        event("recovery", 1051.8, 200, table="demo_lineitem"),
        event("settled", 1052.4, 200, last=2, spark="starting"),
        event("spark_up", 1063.0, 200),
        event("started", 1068.0, 200),
        # The engine's commit time, taken when the epoch was in every sink; the
        # line is written a little later.
        event("first_commit", 1071.5, 200, at=1071.0),
        event("first_commit", 1073.0, 200),  # not a step: only the first counts
        # Killed again before its first commit: the steps it did not reach are None.
        event("process", 1100.7, 300),
        event("settled", 1102.0, 300, last=4, spark="starting"),
    ]
    first, second = restart_steps(events, launches)
    assert first == {
        "process_s": 0.8, "settled_s": 2.4, "spark_up_s": 13.0, "started_s": 18.0,
        "first_commit_s": 21.0, "resumed_s": 21.0,
    }  # fmt: skip
    assert (second["settled_s"], second["spark_up_s"], second["resumed_s"]) == (2.0, None, None)


def test_a_mode_with_nothing_to_settle_reports_no_settled_step() -> None:
    # At-least-once: a batch it wrote before the kill is written again, twice.
    launches = [(100, 1000.0), (200, 1050.0)]
    events = [event(name, 1050.0 + i, 200) for i, name in enumerate(STEPS) if name != "settled"]
    [steps] = restart_steps(events, launches)
    assert steps["settled_s"] is None
    assert steps["resumed_s"] == 4.0


def test_the_first_launch_is_no_restart() -> None:
    assert restart_steps([event("process", 1000.5, 100)], [(100, 1000.0)]) == []
