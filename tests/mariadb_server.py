"""A throwaway MariaDB server for the tests (and the benchmarks): its own folder, port and user.

Built from Debian's ``mariadb-server`` binaries (``mariadbd``,
``mariadb-install-db``): a fresh data directory per server, listening on
127.0.0.1 and a unix socket in its own folder only. As root it runs as the
``mysql`` user (``runuser``), as the tests' Postgres servers run as
``postgres``. A detached watchdog kills the server and deletes its folder if
the process that started it dies without doing so. Where the binaries are
missing it raises, naming the package: a test that needs MariaDB fails, it is
never skipped.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pymysql

from reconcile.demo.embedded_pg import free_port, run_checked

__all__ = ["MariadbServer", "mariadb_binaries"]

# A role that must give its password (the root role of the test server has none).
PASSWORD_USER = "rcuser"
PASSWORD = "m4ria-Pa55word!"

_SEARCH = ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin")


def mariadb_binaries() -> tuple[Path, Path]:
    """``mariadbd`` and ``mariadb-install-db``, wherever Debian (or PATH) put them.

    Raises:
        RuntimeError: none found, naming the package to install.
    """
    found = []
    for names in (("mariadbd", "mysqld"), ("mariadb-install-db", "mysql_install_db")):
        path = next(
            (
                Path(p)
                for name in names
                for p in [shutil.which(name), *(f"{d}/{name}" for d in _SEARCH)]
                if p and Path(p).exists()
            ),
            None,
        )
        if path is None:
            raise RuntimeError(
                f"MariaDB server binaries not found ({' or '.join(names)} in PATH or "
                f"{', '.join(_SEARCH)}): install the Debian package mariadb-server "
                "(scripts/setup does, as root)"
            )
        found.append(path)
    return found[0], found[1]


def _as_mysql() -> list[str]:
    """mariadbd refuses to run as root without --user=root: run it as the mysql user then."""
    return ["runuser", "-u", "mysql", "--"] if os.geteuid() == 0 else []


def _watchdog(root: Path, group: int) -> None:
    """Kill the server and delete its folder once this process is gone (a killed test run).

    The whole process group: ``runuser`` forks, so mariadbd is its child, not itself.
    """
    script = (
        f"while kill -0 {os.getpid()} 2>/dev/null && [ -d '{root}' ]; do sleep 1; done; "
        f"kill -9 -{group} 2>/dev/null; rm -rf '{root}'"
    )
    subprocess.Popen(
        ["sh", "-c", script],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class MariadbServer:
    """One throwaway MariaDB server on 127.0.0.1 and a port of its own.

    Its ``root`` role has no password (over TCP from 127.0.0.1); the role
    ``rcuser`` has one (``PASSWORD``), for the tests that a password never
    shows. Durability across an OS crash is off (``innodb_flush_log_at_trx_commit
    = 2``: each commit is written to the OS, not flushed): a kill -9 of the
    server keeps every acknowledged commit.
    """

    _ids = itertools.count()

    def __init__(self, **settings: Any) -> None:
        self.mariadbd, install_db = mariadb_binaries()
        self.root = Path(tempfile.mkdtemp(prefix="reconcile-mariadb-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, "mysql", "mysql")
        self.data = self.root / "data"
        # Temporary files in a folder of its own: in the shared /tmp, concurrent
        # bootstraps (a worker per core) were seen to lose each other's temp tables.
        (self.root / "tmp").mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.root / "tmp", "mysql", "mysql")
        self.port = free_port()
        self.settings: dict[str, Any] = {
            "innodb-log-file-size": "16M",
            "innodb-buffer-pool-size": "64M",
            "innodb-flush-log-at-trx-commit": 2,
            "innodb-doublewrite": 0,
            "performance-schema": "OFF",
            "character-set-server": "utf8mb4",
            "max-connections": 200,
            "tmpdir": self.root / "tmp",
            **settings,
        }
        run_checked([
            *_as_mysql(), str(install_db), "--no-defaults", f"--datadir={self.data}",
            "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve",
            *self._options(("innodb-log-file-size", "innodb-buffer-pool-size", "tmpdir")),
        ])  # fmt: skip
        self._process: subprocess.Popen[bytes] | None = None
        self.start()
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE USER '{PASSWORD_USER}'@'127.0.0.1' IDENTIFIED BY %s", (PASSWORD,))
            cur.execute(f"GRANT ALL ON *.* TO '{PASSWORD_USER}'@'127.0.0.1' WITH GRANT OPTION")

    def _options(self, names: tuple[str, ...] | None = None) -> list[str]:
        return [f"--{k}={v}" for k, v in self.settings.items() if names is None or k in names]

    # -- lifecycle ------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        """Start the server (again, after a kill -9: InnoDB's crash recovery runs first)."""
        log = self.root / "error.log"
        self._process = subprocess.Popen(
            [
                *_as_mysql(), str(self.mariadbd), "--no-defaults", f"--datadir={self.data}",
                f"--port={self.port}", "--bind-address=127.0.0.1", "--skip-name-resolve",
                f"--socket={self.root / 'mysqld.sock'}", f"--pid-file={self.root / 'mysqld.pid'}",
                f"--log-error={log}", *self._options(),
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        _watchdog(self.root, self._process.pid)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.connect().close()
                return
            except pymysql.err.OperationalError:
                pass
            if self._process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text()[-3000:] if log.exists() else ""
                raise RuntimeError(f"mariadbd did not start on port {self.port}:\n{tail}")
            time.sleep(0.05)

    def server_pid(self) -> int:
        """The pid of mariadbd (a child of runuser, when run as root)."""
        pid_file = self.root / "mysqld.pid"
        if pid_file.exists():
            return int(pid_file.read_text().split()[0])
        assert self._process is not None
        return self._process.pid

    def kill9(self) -> None:
        """kill -9 the server, and wait until it is gone."""
        assert self._process is not None
        os.kill(self.server_pid(), signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=10)

    def stop(self) -> None:
        """Kill the server and delete its folder (the tests keep nothing of it)."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.kill9()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> MariadbServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- access ---------------------------------------------------------------

    def url(self, database: str, *, password: bool = False, port: int | None = None) -> str:
        """The SQLAlchemy URL of ``database`` (as ``rcuser`` with its password if ``password``)."""
        user = f"{PASSWORD_USER}:{PASSWORD}" if password else "root"
        return f"mariadb+pymysql://{user}@127.0.0.1:{port or self.port}/{database}"

    def connect(self, database: str | None = None) -> pymysql.connections.Connection[Any]:
        """A connection as root, autocommit on."""
        return pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", database=database,
            autocommit=True, connect_timeout=5,
        )  # fmt: skip

    def create_database(self, prefix: str = "t") -> str:
        """A fresh database (utf8mb4); its name."""
        name = f"{prefix}_{os.getpid()}_{next(self._ids)}"
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, ending its sessions first (as Postgres's DROP DATABASE ... FORCE)."""
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> "
                "CONNECTION_ID()",
                (name,),
            )
            for (session,) in cur.fetchall():
                with contextlib.suppress(pymysql.err.OperationalError):
                    cur.execute(f"KILL {int(session)}")
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
