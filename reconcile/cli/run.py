"""``reconcile run --config FILE --pipeline NAME [--standby]``: stream a pipeline, highly available.

The pipeline's ``run`` table (``reconcile.cli.config_run``) names the app, the
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

Exit codes, each stop with one line on stderr (secrets of the file's
connections taken out of it and of every log line):

- 0: SIGTERM or SIGINT stopped it cleanly: the query stops, the lease is
  released (a standby need not wait for it to run out), and the last line
  says which signal stopped which pipeline; or the query finished (an
  ``available-now`` trigger). A stop signal is how a service manager ends
  this command (systemd, Kubernetes), so a clean stop is a success: an exit
  of 143 would mark a systemd unit failed on every ``systemctl stop``. A
  second signal while it stops ends the process at once, by that signal;
- 130 or 143: SIGINT or SIGTERM arrived while it was starting (Spark, the
  app), before it ran as main or standby; nothing was written;
- 2: a bad config file or app (the line names the file, the key and the
  value), a setting the database refuses (a missing privilege on the lease
  or a fence), an error no retry cures, or one epoch that failed
  ``reconcile.ha.node.QUERY_FAILURES`` times in a row;
- 3: an epoch's rows were rejected, by the database (a constraint, a value
  the column cannot hold, a privilege on the table) or by the engine's own
  check before anything was sent (a NULL in a NOT NULL column, a value that
  does not fit): the same code whoever found it, as
  ``reconcile.core.decisions.classify`` sorts it (``Failure.REJECTED``). The
  line names the epoch, the table and the constraint or column. Nothing of
  that epoch was written; fix the rows or the table, then start it again.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from reconcile.cli.config import Config, PipelineConfig, RunSettings, load_config
from reconcile.core import interrupts
from reconcile.core.contract import ConfigurationError, ReconcileError
from reconcile.core.decisions import Failure, classify
from reconcile.core.redaction import remember, scrub

if TYPE_CHECKING:
    from reconcile.core.metrics import Metrics
    from reconcile.engine.cycle import CommitCycle

__all__ = [
    "EXIT_ERROR",
    "EXIT_REJECTED",
    "add_run_parser",
    "call_app",
    "exit_code",
    "load_app",
    "run_command",
    "run_settings",
]

log = logging.getLogger("reconcile.run")

EXIT_ERROR = 2  # configuration, or an error no retry cures (see the module docs)
EXIT_REJECTED = 3  # an epoch's rows were rejected (by the database or the engine's check)


def exit_code(error: BaseException) -> int:
    """The exit code of a stop by ``error``: ``reconcile.core.decisions.classify`` decides."""
    return EXIT_REJECTED if classify(error) is Failure.REJECTED else EXIT_ERROR


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
    app: Callable[..., Any],
    spark: Any,
    pipeline: PipelineConfig,
    where: str = "app",
    *,
    streaming: bool = True,
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
    if getattr(made, "isStreaming", None) is not streaming:
        # A rebuild calls the app with a session whose readStream reads in batch.
        what = "a batch DataFrame" if hasattr(made, "isStreaming") else type(made).__name__
        if streaming or not hasattr(made, "isStreaming"):
            raise ConfigurationError(
                f"{where}: returned {what}, not a streaming DataFrame (spark.readStream...)"
            )
        raise ConfigurationError(
            f"{where}: returned a streaming DataFrame when replayed in batch: read the "
            "stream's input with spark.readStream, which the rebuild replays file by file"
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


def run_settings(
    config: Config,
    name: str,
    command: str = "run",
    why: str = "[pipelines.NAME.run] with app and checkpoint; see examples/reconcile.toml",
) -> tuple[PipelineConfig, RunSettings]:
    """The pipeline and its run table, which ``reconcile <command>`` requires (``why``)."""
    pipeline = config.pipeline(name)
    if pipeline.run is None:
        raise ConfigurationError(
            f"{config.path}: pipelines.{name}.run: is required by reconcile {command} ({why})"
        )
    return pipeline, pipeline.run


def _configure_logs(config: Config, verbose: bool) -> None:
    from reconcile.core.logs import configure

    level = config.logs.level
    if verbose and logging.getLevelName(level) > logging.INFO:
        level = "INFO"
    # The formatters end with scrub(), which removes the file's secrets (they
    # were remembered) in every form, tracebacks included.
    configure(json=config.logs.json, level=level)
    # py4j says every connection it opens and closes at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)


def run_command(args: argparse.Namespace) -> int:
    """``reconcile run``: lead or follow until stopped; the exit code (see the module docs)."""
    from reconcile.cli.config_sinks import check_writable

    config = load_config(args.config)
    # Every scrub of this process (each log line, traceback and the last line)
    # now removes the file's secrets in every form (as written, percent-encoded,
    # repr- and JSON-escaped, base64): the app, Spark or a driver may print one bare.
    remember(*config.secrets())
    pipeline, settings = run_settings(config, args.pipeline)
    check_writable(pipeline, config.path)
    _configure_logs(config, args.verbose)
    try:
        stopped_by = _run(config, pipeline, settings, args)
    except ReconcileError as exc:
        if exit_code(exc) == EXIT_REJECTED:
            # The epoch's rows were refused, by the database or by the
            # engine's check before they were sent: one exit code either way.
            return _stop_line(f"pipeline {pipeline.name}: {exc}", EXIT_REJECTED)
        return _stop_line(str(exc), EXIT_ERROR)
    except Exception as exc:
        # Not the engine's error (Spark, a driver, the app's query): its text
        # may echo a connection string, so it is redacted like everything here.
        log.error("pipeline %s: reconcile run failed", pipeline.name, exc_info=True)
        return _stop_line(f"pipeline {pipeline.name}: {type(exc).__name__}: {exc}", exit_code(exc))
    if stopped_by is not None:
        print(f"reconcile run: pipeline {pipeline.name} stopped by {stopped_by}: the query "
              "stopped and the lease was released", file=sys.stderr)  # fmt: skip
    return 0


def _stop_line(text: str, code: int) -> int:
    """Say why it stopped, on one line of stderr (the last one), secrets out; the exit code."""
    # Redacted as it is, then once joined into one line: a secret that a
    # message wrapped over two lines is whole again there.
    print(f"reconcile: error: {scrub(' '.join(scrub(text).split()))}", file=sys.stderr)
    return code


def _run(config: Config, pipeline: PipelineConfig, settings: RunSettings, args: Any) -> str | None:
    """Load the app, start Spark, lead or follow until stopped; close everything on the way out.

    Returns:
        The signal that stopped it (``SIGTERM``), or None when the query finished.
    """
    from reconcile.cli.config_sinks import cycle_builder
    from reconcile.cli.watch import config_metrics

    role = "standby" if args.standby else "main"
    where = _where(config, pipeline, "app")
    app = load_app(settings.app, where)  # before Spark starts: a typo fails in a second
    metrics, exporter = config_metrics(config)
    build = cycle_builder(pipeline, metrics=metrics, file=config.path)
    spark = None
    try:
        if exporter is not None:
            log.info("metrics: %s", getattr(exporter, "url", None) or exporter.path)
        # Until the node runs, SIGINT and SIGTERM raise (the command line's
        # guard): the start-up stops at once, with nothing written.
        with interrupts.step(f"the start of pipeline {pipeline.name}"):
            spark = _spark(pipeline, settings)
            # PySpark put its own SIGINT handler in (it raises a bare
            # KeyboardInterrupt): the guard's again.
            interrupts.reinstall()
            df, outputs = call_app(app, spark, pipeline, f"{where}: {settings.app!r}")
        stop = threading.Event()
        # From here a signal is a graceful stop: the node stops the query and
        # releases the lease.
        with interrupts.stopping(stop) as guard:
            if settings.realtime is not None:
                _run_realtime(pipeline, settings, df, outputs, stop)
            else:
                _run_node(pipeline, settings, role, df, outputs, build, metrics, stop)
        return guard.signal_name
    finally:
        if spark is not None:
            spark.stop()
        if exporter is not None:
            exporter.close()


def _spark(pipeline: PipelineConfig, settings: RunSettings) -> Any:
    from reconcile.spark.session import local_session

    spark = local_session(f"reconcile-{pipeline.name}", settings.master, **settings.spark_conf)
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _run_realtime(
    pipeline: PipelineConfig,
    settings: RunSettings,
    df: Any,
    outputs: dict[str, Any] | None,
    stop: threading.Event,
) -> None:
    from reconcile.cli.run_realtime import run_realtime
    from reconcile.ha import open_lease

    if outputs is not None and any(transform is not _as_is for transform in outputs.values()):
        raise ConfigurationError(
            f"pipeline {pipeline.name}: run.realtime: the app returned a transform per sink; "
            "Real-Time Mode has no micro-batch to transform: return the frame alone"
        )
    lease = open_lease(
        settings.lease.get_secret_value(), pipeline.name, term_s=settings.lease_term_s
    )
    try:
        finished = run_realtime(pipeline, settings, df, lease, stop)
    finally:
        lease.release()
        lease.close()
    log.info("pipeline %s: %s; lease released", pipeline.name,
             "the query finished" if finished else "stopped",
             extra={"pipeline": pipeline.name})  # fmt: skip


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
    from reconcile.ha import HaNode, open_lease

    lease = open_lease(
        settings.lease.get_secret_value(), pipeline.name, term_s=settings.lease_term_s
    )

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
