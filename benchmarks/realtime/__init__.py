"""Benchmark: Kafka -> Spark Real-Time Mode -> PostgreSQL, exactly once against the alternatives.

``python -m benchmarks.realtime [--quick] [--rate 10000] [--duration 60] [--warmup 10]
[--rtm-batch "5 seconds"] [--trigger 0.2] [--checkpoint 30] [--small-ms 20]
[--alo-rows-per-txn 100] [--out DIR]``

One run, one throwaway KRaft broker and one throwaway PostgreSQL server (fsync on,
``track_commit_timestamp`` on), a topic of 2 partitions and a Spark driver (``local[2]``)
per mode, the modes one after another:

- ``rtm_at_least_once``: Real-Time Mode (``trigger(realTime=...)``) with a plain JVM
  ``foreach`` writer (``benchmarks/realtime_jvm/InsertWriter.java``) that inserts in
  transactions of the exactly-once writer's default bounds (100 rows or 100 ms, a timer
  committing) without markers, at-least-once (``--alo-rows-per-txn 1``: each row in
  autocommit);
- ``rtm_exactly_once``: ``reconcile.spark.realtime.start_realtime(writer="jvm")``, its
  defaults (100 rows or 100 ms a transaction), and ``rtm_exactly_once_<N>ms`` with
  ``ms_per_txn`` N (``--small-ms``);
- ``microbatch_pull_and_diff``: the engine's micro-batch writer (``write_stream``, as
  ``benchmarks.kafka``'s ``exactly_once`` mode) at a ``--trigger`` s processing-time trigger;
- ``two_phase_<C>s``: each micro-batch COPYed and PREPAREd, a checkpoint every C s
  (``--checkpoint``) COMMIT PREPAREs them, as a Flink sink does.

Load: records paced at ``--rate`` a second, alternately to each partition, for
``--warmup`` s (left out) and then ``--duration`` s (measured), after one record a
partition has become visible (the query runs). Latency of a record: its Kafka
CreateTime to the commit timestamp of the transaction that made its row visible
(``pg_xact_commit_timestamp(xmin)``). Per mode: rows/s delivered, p50/p90/p99/max, the
rate the producer achieved, and duplicates and missing records counted by SQL.

Targets: exactly-once p99 <= 100 ms and <= 1.5x Real-Time Mode at-least-once's; rows/s
>= 0.9x at-least-once's. Writes ``realtime.json``, ``realtime.md`` and
``realtime_cdf.png`` into ``--out`` (``benchmarks/results`` by default).
"""

from benchmarks.realtime.run import main

__all__ = ["main"]
