"""``reconcile rebuild --config FILE --pipeline P [--app NEW] --plan | --apply | --rollback``.

Brings a pipeline's sink tables to new logic by diff (``reconcile.rebuild``):
only the rows the new logic changes are written. A Spark batch job: it starts
a session as the pipeline's ``run`` table says (master, conf), or takes the
one ``spark-submit`` set up (``reconcile.cli.spark_submit``), and replays the
stream's retained input, the files its checkpoint recorded for every
micro-batch up to the newest decided epoch, through the new app
(``--app``, default the run table's), micro-batch by micro-batch
(``reconcile.spark.replay``).

- ``--plan``: per sink table, the rows the new logic would insert, update
  and delete, and a sample of each. Reads only: no lease, nothing written.
- ``--apply``: takes the pipeline's lease from whoever holds it (a running
  main steps down, a standby waits), rebuilds, and switches the pipeline to
  the new logic version (``--logic-version``, default ``--app``). Run again
  after a failure, it resumes the unfinished rebuild.
- ``--rollback``: undoes an unfinished rebuild: the old logic whole again.

After ``--apply`` only a run of the new logic version starts: set the run
table's ``app`` to the app the rebuild ran (a run of that app carries the
rebuild's logic version, whatever ``--logic-version`` named it, unless the run
table names a third one), or ``logic_version`` to the new version. Exit codes: 0 done (the plan
printed, the rebuild switched, the rollback finished), 2 an error (one line
on stderr, the file's secrets out of it), 130/143 stopped by a signal (an
unfinished rebuild is then resumed or rolled back).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.cli.config import PipelineConfig, RunSettings, load_config
from reconcile.core import interrupts
from reconcile.core.contract import ConfigurationError
from reconcile.core.redaction import remember
from reconcile.rebuild import DEFAULT_PART_ROWS, RebuildReport

__all__ = ["add_rebuild_parser", "print_report", "run_rebuild"]

log = logging.getLogger("reconcile.rebuild")


def add_rebuild_parser(commands: Any) -> None:
    """The ``rebuild`` subcommand, on the ``reconcile`` parser's subparsers."""
    rebuild = commands.add_parser(
        "rebuild",
        help="bring a pipeline's sink tables to new logic by diff: --plan shows what changes, "
        "--apply writes only those rows and switches the pipeline, --rollback undoes an "
        "unfinished rebuild",
    )
    rebuild.add_argument("--config", type=Path, required=True, help="the config file")
    rebuild.add_argument("--pipeline", required=True, help="the pipeline (it needs a run table)")
    rebuild.add_argument("--app", help="the new logic's app, package.module:function "
                         "(default: the run table's app)")  # fmt: skip
    rebuild.add_argument(
        "--logic-version",
        help="the new logic's name, which the pipeline's writers must run afterwards "
        "(default: --app, else the run table's logic_version or app)",
    )  # fmt: skip
    what = rebuild.add_mutually_exclusive_group(required=True)
    what.add_argument("--plan", action="store_true", help="show what would change; write nothing")
    what.add_argument("--apply", action="store_true", help="rebuild (or resume one) and switch")
    what.add_argument("--rollback", action="store_true", help="undo an unfinished rebuild")
    rebuild.add_argument(
        "--part-rows", type=int, default=DEFAULT_PART_ROWS,
        help=f"rows per sink transaction (default {DEFAULT_PART_ROWS})",
    )  # fmt: skip
    rebuild.add_argument("--sample", type=int, default=5, help="keys shown per kind (default 5)")
    rebuild.add_argument("--master", help="the Spark master (default: the run table's)")
    rebuild.add_argument("--json", action="store_true", help="print one JSON object")


def run_rebuild(args: argparse.Namespace, spark: Any = None) -> int:
    """``reconcile rebuild``; the exit code. ``spark``: a session to use (spark-submit's)."""
    from reconcile.cli.config_sinks import check_writable, cycle_builder
    from reconcile.cli.run import load_app, run_settings
    from reconcile.ha import open_lease
    from reconcile.rebuild import plan, rebuild, rollback

    config = load_config(args.config)
    remember(*config.secrets())  # every scrub of this process removes them
    pipeline, settings = run_settings(
        config, args.pipeline, "rebuild", "its app and checkpoint say what to replay"
    )
    check_writable(pipeline, config.path)
    if args.part_rows < 1:
        raise ConfigurationError(
            f"reconcile rebuild: --part-rows must be >= 1, got {args.part_rows}"
        )
    build = cycle_builder(pipeline, file=config.path)

    def lease() -> Any:
        return open_lease(settings.lease.get_secret_value(), pipeline.name,
                          term_s=settings.lease_term_s)  # fmt: skip

    if args.rollback:
        report = rollback(build, lease=lease())
        print_report(report, json_out=args.json)
        return 0
    app_spec = args.app or settings.app
    logic = args.logic_version or args.app or settings.logic
    where = f"{'--app' if args.app else f'{config.path}: pipelines.{pipeline.name}.run.app'}"
    app = load_app(app_spec, where)  # before Spark starts: a typo fails in a second
    started = spark is None
    with interrupts.step(f"the rebuild of pipeline {pipeline.name}"):
        if spark is None:
            spark = _spark(pipeline, settings, args.master)
            interrupts.reinstall()
        try:
            recompute = _recompute(spark, app, app_spec, pipeline, settings)
            if args.plan:
                report = plan(build, recompute, logic_version=logic, sample=args.sample,
                              previous=settings.logic)  # fmt: skip
            else:
                with _bar(sys.stderr.isatty() and not args.json) as progress:
                    report = rebuild(build, recompute, logic_version=logic, lease=lease(),
                                     part_rows=args.part_rows, previous=settings.logic,
                                     sample=args.sample, progress=progress,
                                     app=app_spec)  # fmt: skip
        finally:
            if started:
                spark.stop()
    print_report(report, json_out=args.json)
    return 0


@contextmanager
def _bar(enabled: bool) -> Iterator[Callable[[str, int, int], None] | None]:
    """A progress bar of the sink transactions on stderr, only when it is a terminal."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=True) as bar:  # fmt: skip
        tasks: dict[str, Any] = {}

        def update(what: str, done: int, total: int) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(what, total=total)
            bar.update(tasks[what], completed=done, total=total)

        yield update


def _spark(pipeline: PipelineConfig, settings: RunSettings, master: str | None) -> Any:
    from reconcile.spark.session import local_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = local_session(f"reconcile-rebuild-{pipeline.name}", master or settings.master,
                          **settings.spark_conf)  # fmt: skip
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _recompute(spark: Any, app: Callable[..., Any], spec: str, pipeline: PipelineConfig,
               settings: RunSettings) -> Callable[[str], pa.Table]:  # fmt: skip
    """sink -> its state under the new app, replayed once for every sink at the first call.

    The epoch is read when the rebuild first asks: by then it holds the fence,
    so the newest decided epoch no longer moves.
    """
    from expected_state.progress_log import StoreProgressLog
    from reconcile.cli.run import call_app
    from reconcile.engine.expected import ExpectedState
    from reconcile.spark.replay import replay

    states: dict[str, pa.Table] = {}

    def batch_app(session: Any) -> tuple[Any, Mapping[str, Any] | None]:
        return call_app(app, session, pipeline, f"--app {spec!r}", streaming=False)

    def recompute(sink: str) -> pa.Table:
        if not states:
            epoch = StoreProgressLog(pipeline.store, pipeline.name).last_committed()
            assert epoch is not None, "a rebuild asks only once an epoch was decided"
            keys = {s.name: list(s.keys) for s in pipeline.sinks}
            tables = ExpectedState(pipeline.store, pipeline.name, keys).tables
            wanted: dict[str, tuple[Sequence[str], Sequence[str]]] = {}
            for name, store in tables.items():
                schema = store.user_schema
                if schema is not None:
                    wanted[name] = (store.key_columns, schema.names)
            states.update(replay(spark, batch_app, settings.checkpoint, epoch, wanted,
                                 retained=settings.rebuild_input or None,
                                 store=(pipeline.store, pipeline.name)))  # fmt: skip
        if sink not in states:
            raise ConfigurationError(f"pipeline {pipeline.name!r}: sink {sink!r} holds no epoch")
        return states[sink]

    return recompute


def print_report(report: RebuildReport, *, json_out: bool) -> None:
    """The report as one JSON object, or as a table per sink and the steps' times."""
    if json_out:
        print(json.dumps(report.to_dict(), default=str, sort_keys=True))
        return
    what = {"planned": "plan", "switched": "switched", "rolled_back": "rolled back"}
    before = "an unnamed logic" if report.previous is None else repr(report.previous)
    print(f"pipeline {report.pipeline}: rebuild {report.rebuild or '(plan)'} to logic "
          f"{report.logic_version!r} (from {before}) as of epoch "
          f"{report.base_epoch}: {what.get(report.step, report.step)}"
          + (" (resumed)" if report.resumed else ""))  # fmt: skip
    print(f"{'sink':<20} {'inserts':>9} {'updates':>9} {'deletes':>9} {'applied':>9} "
          f"{'parts':>6}  how")  # fmt: skip
    for name, table in report.tables.items():
        p = table.plan
        counts = ["-"] * 3 if p is None else [str(p.inserts), str(p.updates), str(p.deletes)]
        print(f"{name:<20} {counts[0]:>9} {counts[1]:>9} {counts[2]:>9} {table.applied:>9} "
              f"{table.parts:>6}  {table.how}")  # fmt: skip
        if p is not None and report.step == "planned":
            for kind, keys in p.sample.items():
                if keys:
                    print(f"  {kind}: {', '.join(json.dumps(k, default=str) for k in keys)}")
    steps = ", ".join(f"{k} {v:.1f}s" for k, v in report.seconds.items())
    print(f"steps: {steps}")
