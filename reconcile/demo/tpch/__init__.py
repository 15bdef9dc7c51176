"""``reconcile demo``: TPC-H lineitem streamed by Spark into PostgreSQL exactly once, under chaos.

- ``data``: the TPC-H tables (``tpchgen-cli``), the epoch files dropped into
  the watched folder, and the totals computed straight from the source;
- ``pipeline``: the Spark Structured Streaming process (one per run, killed
  and restarted by the chaos);
- ``events``: the append-only log the pipeline and the supervisor share;
- ``supervisor``: Postgres, the feed, the kills, the restarts, the audit;
- ``summary``: what the run did and found, as text or JSON.
"""
