"""A takeover (a rebuild takes the same step) on MariaDB ends the paused old main's session only.

The old main has an epoch open (prepared, not committed: paused), holding
the fence row's lock. The new writer's ``terminate_old_sessions`` ends that
session, recognised by the mark the writer's sessions hold (a named lock with
the session's own id in it), not by its id: a session of the same user
without the mark, one marked for another pipeline, and a co-tenant's session
that took a lock named like the writer's mark, all live on. The sink runs as
an administrator here, who could end any of them: only the check spares them.
The new writer's epoch then gets the fence row at once, where it used to wait
out the lock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconcile.core.contract import OK, SinkTxnId, WriterIdentity
from reconcile.core.results import CommitSucceeded
from reconcile.engine.cycle import CommitCycle
from reconcile.ha.takeover import terminate_old_sessions
from sinks.sql.sessions import writer_mark
from sinks.sql.sink import SqlSink
from tests.fix_mariadb import MariadbTenants

pytestmark = pytest.mark.integration

PIPE = "shop"
# A new writer that met the old session's lock would fail its epoch in a second.
FAST_LOCKS = "?init_command=SET%20SESSION%20innodb_lock_wait_timeout%20%3D%201"


def _alive(tenants: MariadbTenants) -> set[int]:
    with tenants.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT ID FROM information_schema.PROCESSLIST")
        return {int(r[0]) for r in cur.fetchall()}


def _cycle(tenants: MariadbTenants, progress: Path) -> CommitCycle:
    url = tenants.url("root", query=FAST_LOCKS)
    return CommitCycle(PIPE, [SqlSink(url, "t", name="t")], progress)


def test_a_takeover_ends_the_paused_old_mains_session_and_no_other(
    mariadb_tenants: MariadbTenants, tmp_path: Path
) -> None:
    tenants = mariadb_tenants
    tenants.run(None, "CREATE TABLE `{db}`.t (k VARCHAR(8) COLLATE utf8mb4_nopad_bin "
                      "PRIMARY KEY, v INT, _epoch BIGINT)",
                "REVOKE ALL ON `{db}`.* FROM {app}")  # root's database alone  # fmt: skip
    progress = tmp_path / "progress"
    old = _cycle(tenants, progress)
    old.start()
    assert isinstance(old.run_epoch(1, {"t": [{"k": "a", "v": 1}]}), CommitSucceeded)
    # The old main pauses in the middle of epoch 2: its transaction open, the
    # fence row locked.
    old_sink = old.sinks["t"]
    assert isinstance(old_sink, SqlSink) and old.generation is not None
    paused = SinkTxnId(PIPE, "t", 2, old.generation)
    assert old_sink.stage(paused, [{"k": "b", "v": 2}]) == OK
    assert old_sink.prepare(paused) == OK
    held = old_sink._open[paused.key].held
    assert held is not None and held.session is not None
    log_id = old.progress.log_id
    bystanders: dict[str, Any] = {
        "unmarked": tenants.connect(),
        "other_pipeline": tenants.connect(),
        "impostor": tenants.connect(tenants.cotenant, in_db=False),
    }
    ids = {name: conn.thread_id() for name, conn in bystanders.items()}
    with bystanders["other_pipeline"].cursor() as cur:
        other = writer_mark("elsewhere", "t", log_id)
        cur.execute("SELECT GET_LOCK(CONCAT(%s, CONNECTION_ID()), 0)", (other,))
    with bystanders["impostor"].cursor() as cur:
        # Another user names a lock as the writer's mark with its own id: not ours.
        cur.execute("SELECT GET_LOCK(CONCAT(%s, CONNECTION_ID()), 0)",
                    (writer_mark(PIPE, "t", log_id),))  # fmt: skip
        assert cur.fetchone() == (1,)
    new = _cycle(tenants, progress)
    try:
        assert terminate_old_sessions(new) == 1
        alive = _alive(tenants)
        assert held.session.id not in alive, "the old main's session is still there"
        assert set(ids.values()) <= alive, "a session that was not the old main's was ended"
        new.start()
        # The fence row is free at once: the new writer's epoch commits.
        assert isinstance(new.run_epoch(2, {"t": [{"k": "c", "v": 3}]}), CommitSucceeded)
        with tenants.connect() as conn, conn.cursor() as cur:
            cur.execute("SELECT k, v, _epoch FROM t ORDER BY k")
            assert cur.fetchall() == (("a", 1, 1), ("c", 3, 2))
    finally:
        new.close()
        old.close()
        for conn in bystanders.values():
            conn.close()


def test_a_sink_ends_no_session_when_the_writer_has_none(mariadb_tenants: MariadbTenants) -> None:
    tenants = mariadb_tenants
    tenants.run(None, "CREATE TABLE `{db}`.t (k INT PRIMARY KEY, v INT)")
    sink = SqlSink(tenants.url(), "t", name="t")
    bystander = tenants.connect(tenants.app)
    try:
        assert sink.end_writer_sessions(WriterIdentity(PIPE, "log-1")) == 0
        assert bystander.thread_id() in _alive(tenants)
    finally:
        bystander.close()
        sink.close()
