"""``verify`` / ``repair`` over a config file's sink tables, and ``reconcile watch``.

``reconcile verify --config FILE --all`` checks every sink table the file
names (``--pipeline P`` for one pipeline's, ``--table SINK`` for one);
``--spark`` runs each on Spark (``reconcile.cli.spark_job.spark_check``: full
mode, one session for all). One table's error does not stop the others: it
is reported on its line, with the password redacted. Exit codes suit cron
and alerting: 0 no drift anywhere, 1 drift found (or found and repaired), 2
an error in any table.

``reconcile watch --config FILE --every 60s`` runs that check on a schedule:
by default a scoped verify of the keys changed in the newest ``--epochs``
epochs of each table (cheap: it follows what changed, not the table), with
``--repair`` to repair what it finds, and the findings exported through the
file's ``[metrics]`` (drift found and repaired per sink table).

A repair never lifts a table's mass-change brake (``max_change_fraction``)
here unless ``repair --allow-mass-change`` says so; ``watch --repair`` never
does. A refusal (the brake, a store that lost rows) is an alert instead: a
log line, a ``refused`` field in the JSON, ``reconcile_verify_runs_total``
with the reason as ``result``, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reconcile.cli.config import Config, SinkTableConfig, load_config
from reconcile.cli.config_sinks import split_table
from reconcile.core import interrupts
from reconcile.core.contract import ConfigurationError, ReconcileError
from reconcile.core.metrics import Metrics, NullMetrics, active, record_refusal, record_report
from reconcile.core.redaction import remember
from reconcile.recovery.options import TuningKeywords

if TYPE_CHECKING:  # Spark is an optional extra: imported only for --spark
    from reconcile.cli.spark_job import OnSpark

__all__ = [
    "TableOutcome",
    "check_table",
    "check_tables",
    "config_metrics",
    "parse_every",
    "run_config_recover",
    "run_watch",
]

log = logging.getLogger("reconcile.watch")

_EVERY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_every(text: str) -> float:
    """``60s``, ``5m``, ``1h``, ``500ms`` or plain seconds -> seconds (> 0).

    Raises:
        ConfigurationError: anything else, quoting it.
    """
    match = _EVERY.match(text)
    seconds = float(match.group(1)) * _UNIT[match.group(2) or "s"] if match else 0.0
    if seconds <= 0:
        raise ConfigurationError(
            f"--every {text!r}: expected a positive duration such as 30s, 5m or 1h"
        )
    return seconds


@dataclass(frozen=True)
class TableOutcome:
    """One sink table's check: its report, or the error (one line, password redacted)."""

    pipeline: str
    sink: str
    table: str
    report: Any | None = None  # ReconcileReport
    error: str | None = None
    refused: dict[str, Any] | None = None  # why it refused to run, and the details

    @property
    def drift(self) -> bool:
        return bool(self.report is not None and self.report.drift)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pipeline": self.pipeline, "sink": self.sink, "table": self.table}
        if self.report is not None:
            # default=str: a Spark report's sample keys may be decimals or timestamps.
            out.update(json.loads(json.dumps(self.report.as_dict(), default=str)))
            out["table"] = self.table
        if self.error is not None:
            out["error"] = self.error
        if self.refused is not None:
            out.update(self.refused)
        return out

    def line(self) -> str:
        where = f"{self.pipeline}.{self.sink} ({self.table})"
        if self.refused is not None:
            return f"{where}: refused ({self.refused['refused']}): {self.error}"
        if self.error is not None:
            return f"{where}: error: {self.error}"
        r = self.report
        assert r is not None
        found = (
            f"missing {r.missing}, extra {r.extra}, changed {r.changed}"
            + (f", repaired {r.applied} rows" if r.applied else "")
            + _foreign(r)
            if r.drift
            else "no drift"
        )
        spark = f", on Spark: {r.partitions} key ranges" if hasattr(r, "partitions") else ""
        return f"{where}: {found} (epoch {r.target_epoch}, mode {r.mode}{spark}, {r.seconds:.2f}s)"


def _foreign(report: Any) -> str:
    """The foreign writes among the drift: rows and transactions, or the traced rows' count."""
    rows = getattr(report, "foreign_rows", None)
    if rows:
        txns = report.foreign_transactions
        return f", {rows} rows written by {txns} foreign transaction{'' if txns == 1 else 's'}"
    traced = getattr(report, "foreign_writes", None)
    if traced and rows is None:
        return f", {traced} of the traced rows written by a foreign transaction"
    return ""


def check_table(
    sink: SinkTableConfig,
    *,
    repair: bool,
    mode: str | None = None,
    recent_epochs: int | None = None,
    metrics: Metrics | None = None,
    allow_mass_change: bool = False,
    spark: OnSpark | None = None,
    tuning: TuningKeywords | None = None,
) -> TableOutcome:
    """Verify (or repair) one sink table of a config file; never raises for that table's errors.

    Args:
        sink: the table, as the config file describes it.
        repair: write the difference (else only report).
        mode: overrides the table's configured mode.
        recent_epochs: with scoped mode, check the keys changed in the newest
            this many epochs (instead of since the sink's newest marker).
        metrics: where drift found and repaired is reported.
        allow_mass_change: lift the table's mass-change brake (an operator's
            explicit ``repair --allow-mass-change``; never ``watch``).
        spark: run it on Spark (full mode), in this session.
        tuning: passed to ``recover``: how full mode and a first bucket search
            bound memory (``chunk_rows``, ``spill_dir``), and how many differing
            rows are traced to their last writer (``provenance_rows``; the
            foreign writes among them are exported); default the library's.
    """
    from reconcile.cli.status import missing_store
    from reconcile.recovery import recover

    schema, name = split_table(sink.table)
    try:
        if sink.realtime:
            # WHY refused: no expected state is kept for a Real-Time Mode pipeline, so a
            # check would compare the table with nothing and a repair would delete it.
            raise ConfigurationError(
                f"pipeline {sink.pipeline} runs under Real-Time Mode (run.realtime), whose "
                "expected state is not kept: verify, repair and watch would compare the table "
                "with nothing; its offset markers say what is in it. Nothing was pulled or "
                "written"
            )
        missing = missing_store(sink.store)
        if missing is not None:
            raise ConfigurationError(
                f"{missing}: check the store root in {sink.pipeline}'s config; nothing was "
                "pulled or written"
            )
        since = None
        if recent_epochs is not None:
            from expected_state.store import ExpectedStateStore

            last = ExpectedStateStore(
                sink.store, sink.pipeline, sink.name, list(sink.keys)
            ).last_epoch()
            since = None if last is None else last - recent_epochs
        if spark is not None:
            return _on_spark(spark, sink, repair=repair, allow_mass_change=allow_mass_change,
                             metrics=metrics)  # fmt: skip
        report = recover(
            sink.connection.get_secret_value(),
            sink.store,
            sink.pipeline,
            name,
            sink=sink.name,
            schema=schema,
            keys=sink.keys,
            mode=mode or sink.mode,
            dry_run=not repair,
            since_epoch=since,
            max_change_fraction=sink.max_change_fraction,
            allow_mass_change=allow_mass_change,
            **(tuning or {}),
        )
    except Exception as exc:  # one table's failure is reported; the others still run
        return _failed(sink, exc, metrics)
    record_report(sink.pipeline, report, metrics=metrics)
    if report.foreign_writes is not None:
        # A gauge of the latest run, as the drift rows are: the same unrepaired
        # hand edit found again in the next round is not added up.
        (metrics or active()).set("drift.foreign_writes", report.foreign_writes,
                                  pipeline=sink.pipeline, table=report.table)  # fmt: skip
    return TableOutcome(sink.pipeline, sink.name, sink.table, report=report)


def _on_spark(
    on: OnSpark, sink: SinkTableConfig, *, repair: bool, allow_mass_change: bool,
    metrics: Metrics | None,
) -> TableOutcome:  # fmt: skip
    # Spark is an optional extra (reconcile-engine[spark]): imported for --spark only.
    from reconcile.cli.spark_job import spark_check

    report = spark_check(on, sink, repair=repair, allow_mass_change=allow_mass_change)
    record_report(sink.pipeline, report, metrics=metrics)
    if report.stale:
        # Transactions that found an epoch committed since the pull wrote
        # nothing: the table is not repaired yet, which is an error, not drift.
        return TableOutcome(
            sink.pipeline, sink.name, sink.table, report=report,
            error=f"{report.stale} rows stale (an epoch committed during the repair): run again",
        )  # fmt: skip
    return TableOutcome(sink.pipeline, sink.name, sink.table, report=report)


def _failed(sink: SinkTableConfig, exc: Exception, metrics: Metrics | None) -> TableOutcome:
    """A table's failure as its outcome: one line, password redacted; a refusal is an alert."""
    from reconcile.recovery.report import refused_fields

    text = " ".join(str(exc).split()) or type(exc).__name__
    if not isinstance(exc, ReconcileError):
        text = f"{type(exc).__name__}: {text}"
    text = sink.connection.redact(text)
    refused = refused_fields(exc)
    if refused is not None:
        # An alert, not a crash: the table is left as it is, and says why (the
        # metric, and the outcome's line on stdout). Logged for a library
        # caller's logs, below the command line's ERROR: said there once.
        log.warning("%s.%s (%s): refused (%s): %s", sink.pipeline, sink.name, sink.table,
                    refused["refused"], text)  # fmt: skip
        record_refusal(sink.pipeline, split_table(sink.table)[1], refused["refused"],
                       metrics=metrics)  # fmt: skip
    return TableOutcome(sink.pipeline, sink.name, sink.table, error=text, refused=refused)


def check_tables(
    tables: list[SinkTableConfig],
    *,
    repair: bool,
    mode: str | None = None,
    recent_epochs: int | None = None,
    metrics: Metrics | None = None,
    allow_mass_change: bool = False,
    spark: OnSpark | None = None,
    tuning: TuningKeywords | None = None,
) -> list[TableOutcome]:
    """:func:`check_table` for each table, in order."""
    options: dict[str, Any] = {
        "repair": repair,
        "mode": mode,
        "recent_epochs": recent_epochs,
        "metrics": metrics,
        "allow_mass_change": allow_mass_change,
        "spark": spark,
        "tuning": tuning,
    }
    return [check_table(t, **options) for t in tables]


def exit_code(outcomes: list[TableOutcome]) -> int:
    """2 if any table failed, else 1 if any drifted, else 0."""
    if any(o.error is not None for o in outcomes):
        return 2
    return 1 if any(o.drift for o in outcomes) else 0


def _selected(config: Config, args: argparse.Namespace) -> list[SinkTableConfig]:
    if args.table and not args.pipeline:
        raise ConfigurationError("--table with --config needs --pipeline (the sink's pipeline)")
    if args.table:
        return [config.pipeline(args.pipeline).sink(args.table)]
    if args.pipeline:
        return list(config.tables(args.pipeline))
    if not getattr(args, "all", False):
        raise ConfigurationError(
            "with --config, name what to check: --all, --pipeline P, or --pipeline P --table SINK"
        )
    return list(config.tables())


def _print(outcomes: list[TableOutcome], *, as_json: bool, code: int) -> None:
    """The outcomes on stdout: one line each, or one JSON object.

    A refusal is said once where a person reads it: its line on stdout, or
    with ``--json`` on stderr beside the object (as a one-table repair's
    error line is).
    """
    if as_json:
        print(
            json.dumps({"exit_code": code, "tables": [o.as_dict() for o in outcomes]}), flush=True
        )
        for outcome in outcomes:
            if outcome.refused is not None:
                print(f"reconcile: {outcome.line()}", file=sys.stderr, flush=True)
        return
    for outcome in outcomes:
        print(outcome.line(), flush=True)


def run_config_recover(args: argparse.Namespace) -> int:
    """``verify`` / ``repair`` with ``--config``: every selected table; the exit code."""
    config = load_config(args.config)
    remember(*config.secrets())  # every scrub of this process removes them
    tables = _selected(config, args)
    repair = args.command == "repair"
    lifted = repair and getattr(args, "allow_mass_change", False)
    spark = None
    if args.spark:
        from reconcile.cli.spark_job import OnSpark, check_spark_flags, session

        check_spark_flags(args)  # before the session starts: it takes seconds
        spark = OnSpark(session(args.master or "local[*]"), args.partitions,
                        args.provenance_rows)  # fmt: skip
    outcomes = check_tables(
        tables, repair=repair, mode=args.mode, allow_mass_change=lifted, spark=spark,
        tuning={"chunk_rows": args.chunk_rows, "spill_dir": args.spill_dir,
                "provenance_rows": args.provenance_rows},
    )  # fmt: skip
    code = exit_code(outcomes)
    _print(outcomes, as_json=args.json, code=code)
    return code


def config_metrics(config: Config) -> tuple[Metrics, Any]:
    """The config file's metrics (and its exporter), or nothing to export to."""
    if config.metrics is None:
        return NullMetrics(), None
    from reconcile.cli.prometheus import PrometheusMetrics

    metrics = PrometheusMetrics()
    if config.metrics.textfile is not None:
        exporter: Any = metrics.textfile(
            config.metrics.textfile, interval_s=config.metrics.interval_s
        )
    else:
        exporter = metrics.serve(config.metrics.port or 0, config.metrics.addr)
    return metrics, exporter


def run_watch(args: argparse.Namespace) -> int:
    """``reconcile watch``: check on a schedule until stopped (or ``--count`` rounds)."""
    config = load_config(args.config)
    remember(*config.secrets())  # every scrub of this process removes them
    every = parse_every(args.every)
    if args.epochs < 1:
        raise ConfigurationError(f"--epochs must be >= 1, got {args.epochs}")
    tables = list(config.tables(args.pipeline))
    if not tables:
        raise ConfigurationError(f"{config.path}: no sink tables to watch")
    metrics, exporter = config_metrics(config)
    mode = args.mode or "scoped"
    recent = args.epochs if mode == "scoped" else None
    code = 0
    rounds = 0
    try:
        # SIGINT and SIGTERM raise (reconcile.core.interrupts, installed by the command
        # line): a round stops at once, and the steps below name where it was.
        while True:
            began = time.monotonic()
            # Never with the brake lifted: a watch alerts instead (check_table).
            with interrupts.step(f"round {rounds + 1}"):
                outcomes = check_tables(
                    tables, repair=args.repair, mode=mode, recent_epochs=recent,
                    metrics=metrics,
                )  # fmt: skip
            code = exit_code(outcomes)
            rounds += 1
            last = bool(args.count and rounds >= args.count)
            # The wait begins before the round's lines are printed: a signal sent
            # on reading them is said to have come during the wait, as it did.
            with interrupts.step(f"the wait after round {rounds}"):
                if args.json:
                    found = [o.as_dict() for o in outcomes]
                    print(json.dumps({"round": rounds, "exit_code": code, "tables": found}),
                          flush=True)  # fmt: skip
                    for outcome in outcomes:  # a refusal said once for a person: see _print
                        if outcome.refused is not None:
                            print(f"reconcile watch: [round {rounds}] {outcome.line()}",
                                  file=sys.stderr, flush=True)  # fmt: skip
                else:
                    for outcome in outcomes:
                        print(f"[round {rounds}] {outcome.line()}", flush=True)
                if not last:
                    time.sleep(max(0.0, every - (time.monotonic() - began)))
            if last:
                break
    finally:
        if exporter is not None:
            exporter.close()
    print(f"reconcile watch: stopped after {rounds} round(s)", file=sys.stderr)
    return code
