"""The ``reconcile`` command line: demo, run, status, verify / repair, watch, housekeeping."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reconcile.cli.demo import add_demo_parser, run_demo_command
from reconcile.cli.rebuild import add_rebuild_parser
from reconcile.cli.run import add_run_parser
from reconcile.cli.status import add_status_parser, read_state, run_status
from reconcile.core import interrupts
from reconcile.core.contract import ConfigurationError, ReconcileError
from reconcile.recovery.options import DEFAULT_CHUNK_ROWS
from reconcile.recovery.provenance import DEFAULT_PROVENANCE_ROWS

__all__ = ["READER_GONE", "main", "reader_gone"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``reconcile`` command and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="reconcile", description="Exactly-once delivery and reconciliation engine."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    add_demo_parser(commands)
    add_run_parser(commands)
    add_rebuild_parser(commands)

    add_status_parser(commands)

    for name, text in (
        (
            "verify",
            "compare a sink table with its expected state (exit 1 on drift; writes nothing)",
        ),
        (
            "repair",
            "bring a sink table to its expected state, in one transaction (exit 1 if it did)",
        ),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument(
            "--pg",
            metavar="DSN",
            help="the sink: a libpq DSN, an SQLAlchemy URL or a sink URI (or use --config)",
        )
        sub.add_argument("--store", help="the expected-state store's root (or use --config)")
        sub.add_argument("--pipeline")
        sub.add_argument(
            "--table",
            help="the sink table (and its store table); with --config, the sink's name",
        )
        sub.add_argument(
            "--config", type=Path, help="a config file: check the sink tables it names"
        )
        sub.add_argument(
            "--all", action="store_true", help="with --config: every sink table of every pipeline"
        )
        sub.add_argument(
            "--mode", choices=["full", "scoped", "buckets", "auto"], default=None,
            help="how to find what differs (default auto, or the config file's mode)",
        )  # fmt: skip
        sub.add_argument("--epoch", type=int, help="compare with this epoch (default: the newest)")
        sub.add_argument(
            "--spark", action="store_true",
            help="run as a distributed Spark job (full mode: executors pull key ranges); "
            "with --config, each selected table in turn, in one session",
        )  # fmt: skip
        sub.add_argument("--master", help="with --spark: the Spark master (default local[*])")
        sub.add_argument(
            "--partitions", type=int, help="with --spark: key ranges pulled in parallel"
        )
        sub.add_argument("--schema", help="the sink table's schema (default: the current one)")
        sub.add_argument(
            "--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS, metavar="N",
            help="full mode (and a first bucket search) holds about N rows of each side in "
            f"memory; a larger table is read in parts spilled to disk (default "
            f"{DEFAULT_CHUNK_ROWS:,})",
        )  # fmt: skip
        sub.add_argument(
            "--spill-dir", metavar="DIR",
            help="where the parts are spilled (default: the system's temporary folder)",
        )  # fmt: skip
        sub.add_argument(
            "--provenance-rows", type=int, default=DEFAULT_PROVENANCE_ROWS, metavar="N",
            help="trace up to N differing rows to the transaction that last wrote them (the "
            f"engine's or foreign; PostgreSQL sinks); 0 turns it off (default "
            f"{DEFAULT_PROVENANCE_ROWS})",
        )  # fmt: skip
        sub.add_argument("--json", action="store_true", help="print one JSON object")
    commands.choices["repair"].add_argument(
        "--allow-mass-change", action="store_true",
        help="lift the mass-change brake for this repair: let it delete or change more than the "
        "table's max_change_fraction (default 10%%) of its rows; check with verify first",
    )  # fmt: skip

    watch = commands.add_parser(
        "watch",
        help="verify a config file's sink tables on a schedule (scoped: the recent epochs); "
        "--repair repairs drift; drift is exported through the file's [metrics]",
    )
    watch.add_argument("--config", type=Path, required=True)
    watch.add_argument("--pipeline", help="only this pipeline's sink tables")
    watch.add_argument("--every", default="60s", help="how often: 30s, 5m, 1h (default 60s)")
    watch.add_argument(
        "--epochs", type=int, default=10,
        help="scoped mode: check the keys changed in the newest N epochs (default 10)",
    )  # fmt: skip
    watch.add_argument(
        "--mode", choices=["full", "scoped", "buckets", "auto"], default=None,
        help="how to check (default scoped)",
    )  # fmt: skip
    watch.add_argument("--repair", action="store_true", help="repair the drift found")
    watch.add_argument("--count", type=int, default=0, help="stop after N rounds (default: never)")
    watch.add_argument("--json", action="store_true", help="one JSON object per round")

    pg = commands.add_parser("pg", help="PostgreSQL sink database housekeeping")
    pg_commands = pg.add_subparsers(dest="pg_command", required=True)
    for name, text in (
        (
            "prepared",
            "list the pipeline's prepared txns (all sinks); --settle ends those "
            "no live writer will",
        ),
        ("prune", "delete the markers that neither resolution nor restarts need (--apply)"),
    ):
        sub = pg_commands.add_parser(name, help=text)
        sub.add_argument("--pg", metavar="DSN", required=True, help="the sink database")
        sub.add_argument("--state", type=Path, required=True, help="progress log folder")
        sub.add_argument("--pipeline", required=True)
        sub.add_argument("--json", action="store_true")
    pg_commands.choices["prepared"].add_argument(
        "--settle", action="store_true", help="commit or roll back as the progress log decides"
    )
    prune = pg_commands.choices["prune"]
    prune.add_argument("--keep-epochs", type=int, default=1000, help="newest epochs kept (1000)")
    prune.add_argument("--state-schema", help="schema of reconcile_commits, if there are several")
    prune.add_argument("--apply", action="store_true", help="delete (default: only count)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``reconcile`` console script. Returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.command != "run":  # run logs as the config file's [logs] table says
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.ERROR,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    # SIGINT and SIGTERM stop every command at once: one line, exit 130 or 143.
    guard = interrupts.Guard().install()
    try:
        code = _dispatch(args)
        # Stdout to a pipe is written at exit otherwise: a reader gone (`| head`)
        # shows here, where it is handled, not in the interpreter's last flush.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return reader_gone()
    except KeyboardInterrupt as exc:
        stopped = interrupts.interrupted(exc)
        print(_one_line(stopped.line(f"reconcile {args.command}")), file=sys.stderr)
        return stopped.exit_code
    except ReconcileError as exc:
        return report_failure(args, exc)
    except Exception as exc:
        if args.command not in ("verify", "repair", "watch", "run", "rebuild"):
            raise
        # verify/repair run from cron, run as a service: any failure is exit 2
        # and one line (run has logged the traceback).
        return report_failure(args, exc)
    finally:
        guard.restore()


def _dispatch(args: argparse.Namespace) -> int:
    """Run the chosen command; its exit code."""
    if args.command == "demo":
        return run_demo_command(args)
    if args.command == "pg":
        return _pg(args)
    if args.command in ("verify", "repair"):
        return run_verify_repair(args)
    if args.command == "watch":
        from reconcile.cli.watch import run_watch

        return run_watch(args)
    if args.command == "run":
        from reconcile.cli.run import run_command

        return run_command(args)
    if args.command == "rebuild":
        from reconcile.cli.rebuild import run_rebuild

        return run_rebuild(args)
    return run_status(args)


# What a shell reports for a process SIGPIPE ended (128 + 13), as ``seq 9 | head -1`` ends.
READER_GONE = 141


def reader_gone() -> int:
    """Stdout's reader went away (``reconcile verify ... | head``): stop quietly, as CLI tools do.

    Python ignores SIGPIPE, so the write raised BrokenPipeError instead of ending the
    process: no error line, no traceback. Stdout is pointed at /dev/null first, so that
    the interpreter's last flush at exit does not raise it again.
    """
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return READER_GONE


def run_verify_repair(args: argparse.Namespace) -> int:
    """``verify`` / ``repair``: one table, or a config file's (in-process or ``--spark``).

    Raises:
        ConfigurationError: a flag that this form of the command would not use
            (never dropped silently), or a required one missing.
    """
    _check_flags(args)
    if args.config is not None:
        from reconcile.cli.watch import run_config_recover

        return run_config_recover(args)
    missing = [f"--{n}" for n in ("pg", "store", "pipeline", "table") if not getattr(args, n)]
    if missing:
        raise ConfigurationError(
            f"reconcile {args.command}: {', '.join(missing)} required (or --config FILE)"
        )
    from reconcile.cli.recover import run_recover

    return run_recover(args)


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse a verify/repair flag that the chosen form of the command would ignore."""
    if args.config is not None:
        unused = [f"--{n}" for n in ("pg", "store", "schema", "epoch")
                  if getattr(args, n) is not None]  # fmt: skip
        if unused:
            raise ConfigurationError(
                f"reconcile {args.command}: with --config, the file gives each table's "
                "connection, store and schema, and each table is compared with its own newest "
                f"epoch: drop {', '.join(unused)}"
            )
    elif args.all:
        raise ConfigurationError(
            f"reconcile {args.command}: --all selects every table of a config file: add "
            "--config FILE, or name one table"
        )
    if not args.spark and (args.master is not None or args.partitions is not None):
        raise ConfigurationError(
            f"reconcile {args.command}: --master and --partitions set up the Spark job: add "
            "--spark, or drop them"
        )


def report_failure(args: argparse.Namespace, exc: Exception) -> int:
    """Say why the command failed, on one line of stderr (and as JSON with --json); exit 2.

    With ``--json``, stdout gets one object too: ``error`` (the same line),
    ``table`` for a single table, and the refusal's fields (``refused`` and
    what it counted) when verify or repair refused to run.
    """
    from reconcile.core.contract import RetryableError
    from reconcile.recovery.report import refused_fields

    text = _one_line(str(exc))
    if not isinstance(exc, ReconcileError):
        text = f"{type(exc).__name__}: {text}"
    if isinstance(exc, RetryableError) and args.command != "run":
        # A transient failure (a server down or restarting, epochs that kept
        # committing): a pipeline's driver retries those, a one-off command
        # does not. Say so, so that nobody waits for a retry that never comes.
        text += " (a transient failure: this command does not retry; run it again)"
    print(f"reconcile: error: {text}", file=sys.stderr)
    if getattr(args, "json", False):
        found: dict[str, Any] = {"error": text, "exit_code": 2}
        if args.command in ("verify", "repair") and args.config is None and args.table:
            found["table"] = args.table
        found.update(refused_fields(exc) or {})
        print(json.dumps(found, default=str), flush=True)
    return 2


def _one_line(text: str) -> str:
    """An error message on one line, secrets redacted (cron mails and alerts show one line)."""
    from reconcile.core.redaction import scrub

    return scrub(" ".join(text.split()))


def _pg(args: argparse.Namespace) -> int:
    from sinks.postgres import admin

    progress = read_state(args.state, args.pipeline)
    if getattr(args, "settle", False) or getattr(args, "apply", False):
        interrupts.writing(
            f"what it settled or deleted before stands: run `reconcile pg {args.pg_command}` "
            "without --settle or --apply to see what is left"
        )
    result: Any
    if args.pg_command == "prepared":
        result = admin.prepared(args.pg, args.pipeline, progress, args.state, apply=args.settle)
        lines = [f"{r['gid']}: {r['action']} ({r['reason']})" for r in result]
        lines = lines or ["no prepared transactions of this pipeline"]
    else:
        result = admin.prune(
            args.pg,
            args.pipeline,
            progress,
            keep_epochs=args.keep_epochs,
            state_schema=args.state_schema,
            apply=args.apply,
        )
        verb, count = (
            ("deleted", result.get("deleted"))
            if args.apply
            else (
                "would delete",
                result.get("would_delete"),
            )
        )
        lines = [
            f"{result['schema']}.reconcile_commits: markers of log {result['log_id']} below "
            f"epoch {result['below_epoch']}: {verb} {count}"
        ]
    print(json.dumps(result) if args.json else "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
