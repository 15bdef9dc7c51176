"""A standby process for the lease race test: connect, wait for the start time, try for the lease.

``python -m tests.ha_racer PIPELINE HOLDER START_AT`` with the DSN in
``RECONCILE_TEST_DSN``; prints ``won`` or ``lost``.
"""

from __future__ import annotations

import os
import sys
import time

from sinks.postgres.lease import PgLease


def main(argv: list[str]) -> int:
    pipeline, holder, start_at = argv[0], argv[1], float(argv[2])
    lease = PgLease(os.environ["RECONCILE_TEST_DSN"], pipeline, term_s=30, holder=holder)
    lease.current()  # connected: the race is on the statement, not on the connect
    time.sleep(max(0.0, start_at - time.time()))
    print("won" if lease.try_acquire() is not None else "lost", flush=True)
    lease.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
