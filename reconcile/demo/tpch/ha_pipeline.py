"""The demo pipeline as a ``main`` or a ``standby`` (``reconcile.ha.HaNode``).

``python -m reconcile.demo.tpch.ha_pipeline WORKDIR TRIGGER MASTER VIA ROLE``, with
``RECONCILE_DEMO_DSN`` as for the plain pipeline and the lease term in
``RECONCILE_DEMO_LEASE_S`` (default 2 s). Two such processes share the work
folder: one leads, the other follows the store and takes over when the
leader's lease runs out. The event log gets, besides ``committed`` (with the
generation and tenure that committed it): ``acquired``, ``leading`` (with
what the takeover recovered) and ``stepped_down`` (with why). Each process
stops once every line of lineitem is in a decided epoch.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from reconcile.demo.tpch.pipeline import PIPELINE, DoneCheck, decided_epochs, parse_args, setup
from reconcile.ha import DEFAULT_TERM_S, HaNode, open_lease

__all__ = ["main", "run_role"]


def run_role(
    workdir: Path, dsn: str, master: str, via: str, trigger: dict[str, Any] | None, role: str
) -> int:
    """Run one instance until every line is in (or SIGTERM); the process's exit code."""
    parts = setup(workdir, dsn, master)
    events = parts.events
    term = float(os.environ.get("RECONCILE_DEMO_LEASE_S") or DEFAULT_TERM_S)
    lease = open_lease(dsn, PIPELINE, term_s=term)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    node = HaNode(
        parts.lines,
        parts.build,
        lease=lease,
        checkpoint=str(workdir / "checkpoint"),
        staging=str(workdir / "staging"),
        role=role,
        outputs=parts.outputs,
        trigger=trigger,
        query_name="reconcile_demo",
        via=via,
        on_event=lambda event, fields: events.write(event, **{"holder": lease.holder, **fields}),
    )
    done = DoneCheck(parts.all_in)
    written: dict[int, int] = {}  # id(writer) -> its committed epochs already logged

    def until(n: HaNode) -> bool:
        writer, tenure = n.writer, n.tenure
        if writer is not None and tenure is not None:
            committed = writer.report.committed_epochs
            for epoch in committed[written.get(id(writer), 0) :]:
                events.write("committed", epoch=epoch, generation=tenure.generation,
                             tenure=tenure.tenure, holder=lease.holder)  # fmt: skip
            written[id(writer)] = len(committed)
            # A leader that took over after the last file was read decides
            # nothing new: the newest decided epoch is then the store's.
            newest = max(decided_epochs(writer), default=None)
            return done(newest if newest is not None else n.following_epoch)
        return done(n.following_epoch)

    events.write("started", role=role, holder=lease.holder, term_s=term)
    node.run(until=until, stop=stop)
    if stop.is_set():
        events.write("stopped", holder=lease.holder)
        return 0
    events.write("finished", last=done.checked, holder=lease.holder)
    parts.spark.stop()
    return 0


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if len(args.rest) != 1:
        raise SystemExit("usage: WORKDIR TRIGGER MASTER VIA ROLE (main or standby)")
    return run_role(args.workdir, args.dsn, args.master, args.via, args.trigger, args.rest[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
