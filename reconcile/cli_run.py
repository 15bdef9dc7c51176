"""``reconcile run --config FILE --pipeline NAME [--standby]``: stream a pipeline, highly available.

The pipeline's ``run`` table (``reconcile.config_run``) names the app, the
checkpoint, the staging folder and the lease. The command starts a Spark
session, calls the app for the streaming DataFrame, and runs it as
``reconcile.ha.HaNode``: as the main (tries for the lease at once), or with
``--standby`` as a hot standby (follows the store, takes over when the
leader's lease runs out). Leadership changes are log lines; metrics go where
the file's ``[metrics]`` says, as for ``reconcile watch``.

The app is ``package.module:function``, called as ``function(spark,
pipeline)`` with the SparkSession and the pipeline's ``PipelineConfig``. It
returns a streaming DataFrame, written into every sink of the pipeline as it
is, or ``(DataFrame, {sink name: transform})``, a transform of each
micro-batch per sink as ``write_stream``'s ``outputs`` (a sink left out gets
the batch as it is).

SIGTERM or SIGINT stops it cleanly: the query stops, the lease is released
(a standby need not wait for it to run out), exit code 0. A bad config file
or app is exit 2 with one line naming the file, the key and the value.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from reconcile.config import Config, PipelineConfig, RunSettings, load_config
from reconcile.contract import ConfigurationError, ReconcileError

if TYPE_CHECKING:
    from reconcile.cycle import CommitCycle
    from reconcile.metrics import Metrics

__all__ = ["add_run_parser", "call_app", "load_app", "run_command"]

log = logging.getLogger("reconcile.run")


def add_run_parser(commands: Any) -> None:
    """The ``run`` subcommand, on the ``reconcile`` parser's subparsers."""
    run = commands.add_parser(
        "run",
        help="stream a pipeline as its config file's run table says: the main, or with "
        "--standby a hot standby that takes over when the main's lease runs out",
    )
    run.add_argument("--config", required=True, help="the config file")
    run.add_argument("--pipeline", required=True, help="the pipeline (it needs a run table)")
    run.add_argument(
        "--standby", action="store_true",
        help="start as a standby: follow, and lead only once the leader's lease runs out",
    )  # fmt: skip


def _where(config: Config, pipeline: PipelineConfig, key: str) -> str:
    return f"{config.path}: pipelines.{pipeline.name}.run.{key}"


def load_app(spec: str, where: str = "app") -> Callable[..., Any]:
    """The function ``package.module:function`` names.

    Raises:
        ConfigurationError: the module does not import (or raises while it
            does), or has no such function; the message starts with ``where``.
    """
    module_name, _, function = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"{where}: {spec!r}: cannot import {module_name}: {exc} (is it installed, or on "
            "PYTHONPATH?)"
        ) from None
    except Exception as exc:  # the module's own code failed: say so, in one line
        log.debug("importing %s", module_name, exc_info=True)
        raise ConfigurationError(
            f"{where}: {spec!r}: importing {module_name} raised {type(exc).__name__}: {exc}"
        ) from None
    found = getattr(module, function, None)
    if found is None:
        raise ConfigurationError(f"{where}: {spec!r}: module {module_name} has no {function!r}")
    if not callable(found):
        raise ConfigurationError(
            f"{where}: {spec!r}: {function} is not a function (got {type(found).__name__})"
        )
    return found  # type: ignore[no-any-return]


def call_app(
    app: Callable[..., Any], spark: Any, pipeline: PipelineConfig, where: str = "app"
) -> tuple[Any, dict[str, Any] | None]:
    """Call the app; its streaming DataFrame and its outputs (None: the batch into every sink).

    Raises:
        ConfigurationError: the app raised, returned something else than a
            streaming DataFrame (or a pair of one and a dict of transforms), or
            a transform for a sink the pipeline does not have.
    """
    try:
        made = app(spark, pipeline)
    except ReconcileError:
        raise
    except Exception as exc:  # the user's code: one line, the traceback in the debug log
        log.debug("the app raised", exc_info=True)
        raise ConfigurationError(f"{where}: raised {type(exc).__name__}: {exc}") from None
    outputs: Any = None
    if isinstance(made, tuple):
        if len(made) != 2:
            raise ConfigurationError(
                f"{where}: returned a tuple of {len(made)}; expected a streaming DataFrame, or "
                "(DataFrame, {sink name: transform})"
            )
        made, outputs = made
    if not getattr(made, "isStreaming", False):
        what = "a batch DataFrame" if hasattr(made, "isStreaming") else type(made).__name__
        raise ConfigurationError(
            f"{where}: returned {what}, not a streaming DataFrame (spark.readStream...)"
        )
    if outputs is None:
        return made, None
    return made, _outputs(outputs, pipeline, where)


def _outputs(outputs: Any, pipeline: PipelineConfig, where: str) -> dict[str, Any]:
    if not isinstance(outputs, Mapping):
        raise ConfigurationError(
            f"{where}: the outputs it returned are not a dict {{sink name: transform}} (got "
            f"{type(outputs).__name__})"
        )
    sinks = [sink.name for sink in pipeline.sinks]
    for name, transform in outputs.items():
        if name not in sinks:
            raise ConfigurationError(
                f"{where}: returned outputs for sink {name!r}, which pipeline "
                f"{pipeline.name!r} does not have; its sinks: {sinks}"
            )
        if not callable(transform):
            raise ConfigurationError(
                f"{where}: the output for sink {name!r} is not a function of the micro-batch "
                f"(got {type(transform).__name__})"
            )
    # write_stream takes a transform for every sink once it is given any: the
    # sinks the app left out get the batch as it is.
    return {name: outputs.get(name, _as_is) for name in sinks}


def _as_is(batch: Any) -> Any:
    return batch


def _settings(config: Config, name: str) -> tuple[PipelineConfig, RunSettings]:
    pipeline = config.pipeline(name)
    if pipeline.run is None:
        raise ConfigurationError(
            f"{config.path}: pipelines.{name}.run: is required by reconcile run "
            "([pipelines.NAME.run] with app and checkpoint; see examples/reconcile.toml)"
        )
    return pipeline, pipeline.run


def _configure_logs(config: Config, verbose: bool) -> None:
    from reconcile.logs import configure

    level = config.logs.level
    if verbose and logging.getLevelName(level) > logging.INFO:
        level = "INFO"
    configure(json=config.logs.json, level=level)
    # py4j says every connection it opens and closes at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)


def run_command(args: argparse.Namespace) -> int:
    """``reconcile run``: lead or follow until SIGTERM/SIGINT; the exit code."""
    from reconcile.cli_config import config_metrics
    from reconcile.config_sinks import check_writable, cycle_builder

    config = load_config(args.config)
    pipeline, settings = _settings(config, args.pipeline)
    check_writable(pipeline, config.path)
    _configure_logs(config, args.verbose)
    role = "standby" if args.standby else "main"
    where = _where(config, pipeline, "app")
    app = load_app(settings.app, where)  # before Spark starts: a typo fails in a second
    metrics, exporter = config_metrics(config)
    build = cycle_builder(pipeline, metrics=metrics, file=config.path)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    spark = None
    try:
        if exporter is not None:
            log.info("metrics: %s", getattr(exporter, "url", None) or exporter.path)
        spark = _spark(pipeline, settings)
        df, outputs = call_app(app, spark, pipeline, f"{where}: {settings.app!r}")
        if not stop.is_set():
            _run_node(pipeline, settings, role, df, outputs, build, metrics, stop)
    except ReconcileError:
        raise
    except Exception as exc:
        # Not the engine's error (Spark, a driver, the app's query): its text
        # may echo a connection string, so every secret of the file's
        # connections is taken out of the logged traceback and of the line.
        trace = _redact(pipeline, settings, traceback.format_exc())
        log.error("pipeline %s: reconcile run failed:\n%s", pipeline.name, trace)
        text = _redact(pipeline, settings, f"{type(exc).__name__}: {exc}")
        raise ReconcileError(f"pipeline {pipeline.name}: {text}") from None
    finally:
        if spark is not None:
            spark.stop()
        if exporter is not None:
            exporter.close()
    return 0


def _redact(pipeline: PipelineConfig, settings: RunSettings, text: str) -> str:
    for connection in (settings.lease, *(sink.connection for sink in pipeline.sinks)):
        text = connection.redact(text)
    return text


def _spark(pipeline: PipelineConfig, settings: RunSettings) -> Any:
    from reconcile.spark.session import local_session

    spark = local_session(f"reconcile-{pipeline.name}", settings.master, **settings.spark_conf)
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _run_node(
    pipeline: PipelineConfig,
    settings: RunSettings,
    role: str,
    df: Any,
    outputs: dict[str, Any] | None,
    build: Callable[[], CommitCycle],
    metrics: Metrics,
    stop: threading.Event,
) -> None:
    from reconcile.ha import HaNode, PgLease

    lease = PgLease(settings.lease.get_secret_value(), pipeline.name, term_s=settings.lease_term_s)

    def on_event(event: str, fields: dict[str, Any]) -> None:
        shown = ", ".join(f"{k} {v}" for k, v in fields.items())
        # A step-down other than our own stop is worth a warning (the lease
        # was lost, a fence rejected us, the query kept failing).
        stepped = event == "stepped_down" and fields.get("reason") != "stopped"
        level = logging.WARNING if stepped else logging.INFO
        log.log(level, "pipeline %s: %s (%s) as %s", pipeline.name, event, shown, lease.holder,
                extra={"pipeline": pipeline.name})  # fmt: skip

    node = HaNode(
        df,
        build,
        lease=lease,
        checkpoint=settings.checkpoint,
        staging=settings.staging,
        role=role,
        outputs=outputs,
        trigger=settings.trigger_args,
        query_name=f"reconcile_{pipeline.name}",
        via=settings.via,
        collect_max_bytes=settings.collect_max_bytes,
        metrics=metrics,
        on_event=on_event,
    )
    log.info(
        "pipeline %s: running as %s (holder %s); lease in %s (from %s, term %.1fs); "
        "checkpoint %s; app %s",
        pipeline.name, role, lease.holder, settings.lease, settings.lease_from,
        settings.lease_term_s, settings.checkpoint, settings.app,
        extra={"pipeline": pipeline.name},
    )  # fmt: skip
    node.run(stop=stop)
    finished = bool(node.tenures) and node.tenures[-1].ended == "query finished"
    log.info("pipeline %s: %s; lease released", pipeline.name,
             "the query finished" if finished else "stopped",
             extra={"pipeline": pipeline.name})  # fmt: skip
