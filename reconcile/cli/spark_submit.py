"""``reconcile verify|repair|rebuild`` as a Spark job: the file to give ``spark-submit``.

It takes the command's own arguments and runs them on Spark, whether or not
``--spark`` is given, in the session spark-submit set up (its master). On a
cluster::

    job=$(python -c 'import reconcile.cli.spark_submit as j; print(j.__file__)')
    spark-submit --master spark://host:7077 "$job" verify --pg "$DSN" \\
        --store /shared/expected --pipeline orders --table order_lines --json

Exit codes as for the in-process commands: 0 no drift, 1 drift found (or
found and repaired), 2 an error, on one line with the password redacted;
130 or 143 when SIGINT or SIGTERM stopped it (its Spark jobs are cancelled
and a session it started is stopped first).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from reconcile.cli.command import build_parser, report_failure, run_verify_repair
from reconcile.cli.rebuild import run_rebuild
from reconcile.cli.spark_job import session

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``spark-submit`` entry point: the CLI's verify/repair arguments; Spark's own master."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command not in ("verify", "repair", "rebuild"):
        print("reconcile: error: the Spark job runs verify, repair or rebuild", file=sys.stderr)
        return 2
    if args.command == "rebuild":
        try:  # spark-submit's session: the rebuild uses it and leaves it to spark-submit
            return run_rebuild(args, spark=session(args.master))
        except Exception as exc:
            return report_failure(args, exc)
    args.spark = True  # submitted, it runs on Spark whether or not --spark was given
    try:
        # The session first: spark-submit has set the master, and getOrCreate()
        # takes it as it is (a later --master default does not replace it).
        session(args.master)
        return run_verify_repair(args)
    except Exception as exc:
        return report_failure(args, exc)


if __name__ == "__main__":
    sys.exit(main())
