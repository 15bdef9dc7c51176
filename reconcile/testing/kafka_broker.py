"""A throwaway Kafka broker of its own: for the tests, the Kafka demo and the benchmark.

A single-node KRaft cluster (the node is broker and controller at once) started
from the broker's JARs, which ``scripts/fetch-jars`` keeps in the venv
(``.venv/jars/kafka-broker/``): ``kafka.tools.StorageTool format`` once, then
``kafka.Kafka``. It listens on 127.0.0.1 only, on free ports, with its log
folder in a temporary folder of its own; a detached watchdog stops it and
deletes the folder if the process that started it dies without doing so.

Transactions need their internal topics on one node: the offsets and
transaction-state topics get replication factor 1 and min ISR 1. Nothing is
downloaded here: a missing JAR cache is an error that names ``scripts/setup``.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from reconcile.core.contract import ConfigurationError

__all__ = ["KafkaBroker", "broker_jars"]

# How long a broker may take to accept connections (a JVM start on a busy 2-core machine).
_START_TIMEOUT_S = 120.0


def broker_jars() -> Path:
    """The folder of the broker's JARs in this venv's cache.

    Raises:
        ConfigurationError: the cache is missing, naming the script that fills it.
    """
    folder = Path(sys.prefix) / "jars" / "kafka-broker"
    if not any(folder.glob("kafka_2.13-*.jar")):
        raise ConfigurationError(
            f"the Kafka broker's JARs are not in {folder}: run scripts/setup (or "
            "scripts/fetch-jars), which fetches them once from Maven Central"
        )
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _watchdog(root: Path, pid_file: Path) -> None:
    """Kill the broker and delete ``root`` if this process dies without stopping it."""
    script = (
        f"while kill -0 {os.getpid()} 2>/dev/null && [ -d '{root}' ]; do sleep 1; done; "
        f"if [ -d '{root}' ]; then kill -9 $(cat '{pid_file}' 2>/dev/null) 2>/dev/null; "
        f"rm -rf '{root}'; fi"
    )
    subprocess.Popen(
        ["sh", "-c", script],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class KafkaBroker:
    """One throwaway single-node KRaft broker on 127.0.0.1.

    Args:
        keep: leave it running and its folder in place at exit (``stop()``
            still removes both).
        heap_mb: the JVM's heap.
        settings: ``server.properties`` entries over the defaults (for
            example ``transaction.max.timeout.ms`` or ``message.max.bytes``).
    """

    def __init__(self, *, keep: bool = False, heap_mb: int = 512, **settings: Any) -> None:
        self.jars = broker_jars()
        self.root = Path(tempfile.mkdtemp(prefix="reconcile-kafka-"))
        self.port, self.controller_port = _free_port(), _free_port()
        self.heap_mb = heap_mb
        self.settings: dict[str, Any] = {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.root / "data"),
            "num.partitions": 1,
            # One node: the internal topics that transactions and consumer groups
            # need must not ask for more replicas than there are brokers.
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 1,
            "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "false",
        }
        self.settings.update(settings)
        self.properties = self.root / "server.properties"
        self.properties.write_text("".join(f"{k}={v}\n" for k, v in self.settings.items()))
        (self.root / "log4j2.properties").write_text(
            "rootLogger.level = WARN\nrootLogger.appenderRef.file.ref = file\n"
            "appender.file.type = File\nappender.file.name = file\n"
            f"appender.file.fileName = {self.root / 'broker.log'}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = %d %p %c{1}: %m%n\n"
        )
        self.pid_file = self.root / "broker.pid"
        self.process: subprocess.Popen[bytes] | None = None
        if not keep:
            _watchdog(self.root, self.pid_file)
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        # (the id may start with a "-": given as --cluster-id=..., never as a separate argument)
        self._java(
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster}",
            "-c",
            str(self.properties),
        )
        self.start()

    @property
    def bootstrap(self) -> str:
        """``host:port`` for a client's ``bootstrap.servers``."""
        return f"127.0.0.1:{self.port}"

    def _command(self, main: str, *args: str) -> list[str]:
        java = shutil.which("java") or "java"
        return [
            java,
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # a short-lived test broker: start fast, not peak
            f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
            "-cp",
            f"{self.jars}/*",
            main,
            *args,
        ]

    def _java(self, main: str, *args: str) -> None:
        done = subprocess.run(
            self._command(main, *args), capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{main} {' '.join(args)} failed:\n{done.stdout}{done.stderr}")

    def start(self) -> None:
        """Start the broker (again, after ``kill9`` or ``shutdown``) and wait until it accepts."""
        with (self.root / "broker.out").open("ab") as out:
            self.process = subprocess.Popen(
                self._command("kafka.Kafka", str(self.properties)),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid_file.write_text(str(self.process.pid))
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited at start:\n{self.log_tail()}")
            if self._ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"the Kafka broker did not start in {_START_TIMEOUT_S:.0f} s:\n"
                           f"{self.log_tail()}")  # fmt: skip

    def _ready(self) -> bool:
        """Whether the broker answers metadata requests (its listener alone is not enough)."""
        from confluent_kafka.admin import AdminClient

        try:
            brokers = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
        except Exception:  # KafkaException while it starts: not ready yet
            return False
        return bool(brokers.brokers)

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the broker's own log and its console output."""
        parts = []
        for name in ("broker.log", "broker.out"):
            path = self.root / name
            if path.exists():
                parts.append(path.read_text(errors="replace")[-chars:])
        return "\n".join(parts)

    def kill9(self) -> None:
        """SIGKILL the broker, as a crash would; ``start()`` brings it back with its data."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def shutdown(self) -> None:
        """Stop the broker cleanly (SIGTERM); it keeps its data."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill9()

    def stop(self) -> None:
        """Stop the broker at once and delete its folder."""
        self.kill9()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> KafkaBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
