"""A throwaway PostgreSQL server of its own: for the demo, the benchmarks and the tests.

It is built from the PostgreSQL server binaries installed on the machine
(``pg_config --bindir``, else Debian's ``/usr/lib/postgresql/<major>/bin``):
an ``initdb`` once per process (or once per folder named by
``RECONCILE_PG_TEMPLATE_CACHE``), copied for every server, listening on
127.0.0.1 and a unix socket in its own folder only. PostgreSQL refuses to run
as root, so as root it runs as the ``postgres`` user (``runuser``). A detached
watchdog stops the server and deletes its folder if the process that started
it dies without doing so (a killed test run, a killed demo).

Where no server binaries exist, :func:`start_server` falls back to
``pgserver`` (PyPI: a self-contained PostgreSQL 16), when it is installed and
the process is not root.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from reconcile.core.contract import ConfigurationError

__all__ = [
    "EmbeddedPostgres",
    "as_postgres",
    "chown_to_postgres",
    "free_port",
    "pg_bindir",
    "run_checked",
    "start_server",
    "watchdog",
]

_MAJORS = ("15", "16", "17", "14")
_TEMPLATES: dict[Path, Path] = {}  # bindir -> an initdb'ed data dir, copied for every server


def pg_bindir() -> Path:
    """The PostgreSQL server binaries (``pg_config --bindir``, else Debian's paths).

    Raises:
        ConfigurationError: none found, naming where it looked and what to install.
    """
    candidates = []
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
        candidates.append(Path(out.stdout.strip()))
    candidates += [Path(f"/usr/lib/postgresql/{m}/bin") for m in _MAJORS]
    for path in candidates:
        if (path / "initdb").exists() and (path / "pg_ctl").exists():
            return path
    raise ConfigurationError(
        f"PostgreSQL server binaries not found (looked in {[str(c) for c in candidates]}); "
        "install the Debian package postgresql (or pip install pgserver, as a non-root user)"
    )


def as_postgres() -> list[str]:
    """Postgres refuses to run as root: run its binaries as the postgres user then."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def chown_to_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


def run_checked(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# A folder where an initdb'ed data directory is kept for later processes too (the
# tests set it: hundreds of short test processes each paid for an initdb).
TEMPLATE_CACHE_ENV = "RECONCILE_PG_TEMPLATE_CACHE"
_INITDB = ("-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")


def _template(bindir: Path) -> Path:
    """initdb once per process (and binaries); every server starts from a copy.

    With ``RECONCILE_PG_TEMPLATE_CACHE`` naming a folder, once per folder and
    binaries: the data directory is kept there for every later process.
    """
    if bindir not in _TEMPLATES:
        cache = os.environ.get(TEMPLATE_CACHE_ENV)
        _TEMPLATES[bindir] = _kept_template(Path(cache), bindir) if cache else _own_template(bindir)
    return _TEMPLATES[bindir]


def _initdb(bindir: Path, root: Path) -> Path:
    chown_to_postgres(root)
    data = root / "data"
    run_checked([*as_postgres(), str(bindir / "initdb"), "-D", str(data), *_INITDB])
    return data


def _own_template(bindir: Path) -> Path:
    root = Path(tempfile.mkdtemp(prefix="reconcile-pgtpl-"))
    data = _initdb(bindir, root)
    atexit.register(shutil.rmtree, root, True)
    watchdog(root, None, bindir)
    return data


def _kept_template(cache: Path, bindir: Path) -> Path:
    """The template kept in ``cache`` for these binaries, made first if none is there yet."""
    postgres = bindir / "postgres"
    seen = f"{bindir.resolve()}:{postgres.stat().st_mtime_ns}:{' '.join(_INITDB)}"
    kept = cache / hashlib.sha256(seen.encode()).hexdigest()[:16]
    if (kept / "data" / "PG_VERSION").exists():
        return kept / "data"
    cache.mkdir(parents=True, exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix="making-", dir=cache))
    try:
        _initdb(bindir, made)
        # Whole or not at all: a rename, and a process that made one beside keeps its own.
        made.rename(kept)
    except OSError:
        if not (kept / "data" / "PG_VERSION").exists():
            raise
    finally:
        shutil.rmtree(made, ignore_errors=True)
    return kept / "data"


def watchdog(root: Path, data: Path | None, bindir: Path) -> None:
    """Stop the server and delete its folder if this process dies without doing it.

    A run killed by a timeout (SIGKILL/SIGTERM) runs no finalizer; this detached
    shell notices that the process is gone and cleans up. After a normal stop()
    the folder is gone and the shell exits by itself.
    """
    pg_ctl = " ".join([*as_postgres(), str(bindir / "pg_ctl")])
    stop = f"{pg_ctl} -D '{data}' -m immediate stop >/dev/null 2>&1; " if data else ""
    script = (
        f"while kill -0 {os.getpid()} 2>/dev/null && [ -d '{root}' ]; do sleep 1; done; "
        f"if [ -d '{root}' ]; then {stop}rm -rf '{root}'; fi"
    )
    subprocess.Popen(
        ["sh", "-c", script],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class EmbeddedPostgres:
    """One throwaway server: its own folder and port, on 127.0.0.1 only.

    Args:
        password: the ``postgres`` role's password, required over TCP (SCRAM);
            None: trusted connections (tests). ``start_server`` makes one up.
        hba: extra ``pg_hba.conf`` rules, put before the defaults.
        keep: leave the server running and its folder in place at exit
            (``stop()`` still removes it).
        settings: ``postgresql.conf`` settings over the defaults (fsync is off
            unless given: the tests and the demo need no durability across an
            OS crash; the benchmarks turn it on).
    """

    _ids = itertools.count()

    def __init__(
        self,
        *,
        password: str | None = None,
        hba: Sequence[str] = (),
        keep: bool = False,
        **settings: Any,
    ) -> None:
        self.bindir = pg_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="reconcile-pg-"))
        chown_to_postgres(self.root)
        self.data = self.root / "data"
        shutil.copytree(_template(self.bindir), self.data, symlinks=True)
        self.password = password
        rules = list(hba)
        if password is not None:
            rules += ["host all all 127.0.0.1/32 scram-sha-256", "local all all trust"]
        hba_path = self.data / "pg_hba.conf"
        hba_path.write_text("".join(r + "\n" for r in rules) + hba_path.read_text())
        if os.geteuid() == 0:
            run_checked(["chown", "-R", "postgres:postgres", str(self.root)])
        os.chmod(self.data, 0o700)
        self.port = free_port()
        self.settings: dict[str, Any] = {
            "listen_addresses": "127.0.0.1",
            "port": self.port,
            "unix_socket_directories": str(self.root),
            "max_prepared_transactions": 20,
            "max_connections": 100,
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "128MB",
            "log_min_messages": "warning",
        }
        self.settings.update(settings)
        conf = "".join(f"{k} = '{v}'\n" for k, v in self.settings.items())
        (self.data / "postgresql.auto.conf").write_text(conf)
        self._dbs = itertools.count()
        if not keep:
            watchdog(self.root, self.data, self.bindir)
        self.start()
        if password is not None:
            with self._local() as conn:
                conn.execute(
                    sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(password))
                )

    # -- lifecycle ------------------------------------------------------------

    def _pg_ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run_checked(
            [*as_postgres(), str(self.bindir / "pg_ctl"), "-D", str(self.data), *args],
            timeout=timeout,
        )

    def start(self, attempts: int = 40) -> None:
        """Start (or restart after a kill -9: old backends may still be exiting)."""
        log = str(self.root / "server.log")
        for attempt in range(attempts):
            try:
                self._pg_ctl("-l", log, "-w", "-t", "60", "start")
                return
            except RuntimeError:
                if attempt == attempts - 1:
                    tail = Path(log).read_text()[-3000:] if Path(log).exists() else ""
                    raise RuntimeError(
                        f"postgres did not start on port {self.port}:\n{tail}"
                    ) from None
                time.sleep(0.25)

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def kill9(self) -> None:
        """kill -9 the postmaster (its backends then exit on their own)."""
        pid = self.postmaster_pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)

    def restart_after_crash(self) -> None:
        self.start()

    def shutdown(self, mode: str = "fast") -> None:
        """Stop the server (it keeps its data; ``start()`` brings it back)."""
        self._pg_ctl("-m", mode, "-w", "stop", timeout=60)

    def stop(self) -> None:
        """Stop the server at once and delete its folder."""
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._pg_ctl("-m", "immediate", "stop", timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EmbeddedPostgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- access ---------------------------------------------------------------

    def dsn(
        self,
        dbname: str = "postgres",
        user: str = "postgres",
        port: int | None = None,
        **extra: str,
    ) -> str:
        """A libpq DSN for ``dbname`` (with the password, if the server has one)."""
        parts = {
            "host": "127.0.0.1",
            "port": str(port or self.port),
            "dbname": dbname,
            "user": user,
            "sslmode": "disable",
            "gssencmode": "disable",
            **extra,
        }
        if self.password is not None and user == "postgres" and "password" not in parts:
            parts["password"] = self.password
        return " ".join(f"{k}={v}" for k, v in parts.items())

    def _local(self) -> psycopg.Connection[Any]:
        """A connection over the unix socket (trusted), for set-up."""
        return psycopg.connect(
            host=str(self.root), port=self.port, dbname="postgres", user="postgres",
            autocommit=True,
        )  # fmt: skip

    def connect(self, dbname: str = "postgres", **kw: Any) -> psycopg.Connection[Any]:
        kw.setdefault("autocommit", True)
        return psycopg.connect(self.dsn(dbname), **kw)

    def create_database(self, prefix: str = "t") -> str:
        """Create a fresh database; its name."""
        name = f"{prefix}_{next(self._ids)}_{next(self._dbs)}"
        with self.connect() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE template0 STRATEGY file_copy").format(
                    sql.Identifier(name)
                )
            )
        return name

    def drop_database(self, name: str) -> None:
        with self.connect() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


class _PgserverPostgres:
    """The ``pgserver`` fallback: a bundled PostgreSQL where no server binaries exist."""

    def __init__(self, root: Path) -> None:
        import pgserver  # type: ignore[import-not-found]

        self.root = root
        self._server = pgserver.get_server(str(root), cleanup_mode="stop")

    def dsn(self, dbname: str = "postgres") -> str:
        uri: str = self._server.get_uri(dbname)
        return uri

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._server.cleanup()


@contextlib.contextmanager
def start_server(*, keep: bool = False, **settings: Any) -> Iterator[Any]:
    """A throwaway server for the duration of the block (left running with ``keep``).

    Local binaries first (a random password for the ``postgres`` role, over
    TCP on 127.0.0.1); else ``pgserver``, when installed and not root.

    Raises:
        ConfigurationError: neither is available, saying what to install.
    """
    try:
        pg_bindir()
    except ConfigurationError:
        if os.geteuid() == 0:
            raise
        try:
            import pgserver  # noqa: F401
        except ImportError:
            raise ConfigurationError(
                "no PostgreSQL server binaries and no pgserver: install the Debian package "
                "postgresql, or pip install pgserver, or give --pg DSN"
            ) from None
        fallback = _PgserverPostgres(Path(tempfile.mkdtemp(prefix="reconcile-pgserver-")))
        try:
            yield fallback
        finally:
            if not keep:
                fallback.stop()
                shutil.rmtree(fallback.root, ignore_errors=True)
        return
    server = EmbeddedPostgres(password=secrets.token_urlsafe(18), keep=keep, **settings)
    try:
        yield server
    finally:
        if not keep:
            server.stop()
