"""An Airflow DAG: verify a pipeline's sink tables every hour with the Spark job, repair on demand.

Each task runs ``spark-submit`` on the engine's Spark job (``reconcile/cli/spark_submit.py``)
with the arguments of ``reconcile verify``; its exit code fails the task on drift
(1) or on an error (2), which is what alerting watches. The database's DSN, with
its password, comes from an environment variable of the worker (or an Airflow
connection exported as one), never from the DAG file.

The command lines are built by :func:`verify_command`, which needs no Airflow:
the tests run the very command a task would run.
"""

from __future__ import annotations

import datetime as dt
import shlex

MASTER = "local[*]"  # e.g. "spark://spark-master:7077" or "yarn"
STORE = "/shared/reconcile/expected"  # the expected-state store root every executor sees
PIPELINE = "orders"
TABLES = ("order_lines", "customer_totals")
DSN_ENV = "ORDERS_PG_DSN"  # the worker's environment holds the DSN (and its password)


def verify_command(
    table: str,
    *,
    master: str = MASTER,
    store: str = STORE,
    pipeline: str = PIPELINE,
    dsn_env: str = DSN_ENV,
    repair: bool = False,
) -> str:
    """The bash command a task runs: spark-submit of the engine's job on one sink table."""
    from reconcile.cli import spark_submit as job

    head = shlex.join(["spark-submit", "--master", master, job.__file__])
    tail = shlex.join(["--store", store, "--pipeline", pipeline, "--table", table, "--json"])
    # The DSN is expanded by bash from the worker's environment, so it is in no
    # DAG file, no rendered template and no task log.
    return f'{head} {"repair" if repair else "verify"} --pg "${dsn_env}" {tail}'


try:
    from airflow import DAG
    from airflow.operators.bash import BashOperator
except ImportError:  # Airflow is not installed: the commands above are still importable
    DAG = None

if DAG is not None:
    with DAG(
        dag_id=f"reconcile_verify_{PIPELINE}",
        schedule="@hourly",
        start_date=dt.datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,
        tags=["reconcile"],
    ) as dag:
        for sink_table in TABLES:
            BashOperator(task_id=f"verify_{sink_table}", bash_command=verify_command(sink_table))
