"""Structured logs: the cycle's and a sink's lines carry pipeline, epoch, sink, txn and xid."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

import reconcile.core.logs
from reconcile import CommitCycle, CommitSucceeded, MemoryProgressLog, RetryPolicy, drive
from reconcile.core.contract import SinkOutcome, SinkTxnId
from reconcile.core.logs import ContextFilter, JsonFormatter, configure, context, current
from reconcile.core.results import log_result
from reconcile.core.staged import StagedEpoch
from reconcile.engine.faults import Fault, FaultKind, FaultPlan
from sinks.memory.sink import MemorySink, MemoryStore

sink_log = logging.getLogger("reconcile.sinks.test")


class XidSink(MemorySink):
    """Logs its commit the way the Postgres sink does: the xid as a field."""

    def commit(self, txn_id: SinkTxnId) -> SinkOutcome:
        outcome = super().commit(txn_id)
        sink_log.info("sink %s: %s committed, xid 42", self.name, txn_id, extra={"xid": "42"})
        return outcome


@pytest.fixture
def lines() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """Read the JSON lines of every reconcile.* record, through the filter and formatter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("reconcile")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def test_a_cycles_epoch_line_and_a_sinks_commit_line_carry_their_fields() -> None:
    stream = io.StringIO()
    handler = configure(json=True, level="INFO", stream=stream)
    try:
        cycle = CommitCycle("shop", [XidSink("orders", MemoryStore())], MemoryProgressLog())
        cycle.start()
        assert cycle.run_epoch(0, {"orders": [{"k": 1}]}) == CommitSucceeded(0)
    finally:
        logging.getLogger().removeHandler(handler)
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    epoch_line = next(r for r in records if "epoch 0 committed" in str(r["message"]))
    assert epoch_line["logger"] == "reconcile.cycle" and epoch_line["level"] == "INFO"
    assert (epoch_line["pipeline"], epoch_line["epoch"], epoch_line["generation"]) == ("shop", 0, 1)
    assert "sink" not in epoch_line  # the epoch spans every sink
    commit_line = next(r for r in records if r["logger"] == "reconcile.sinks.test")
    assert commit_line["pipeline"] == "shop" and commit_line["epoch"] == 0
    assert commit_line["sink"] == "orders" and commit_line["xid"] == "42"
    assert commit_line["txn"] == "shop-orders-0-g1"
    start_line = next(r for r in records if "started as generation" in str(r["message"]))
    assert start_line["pipeline"] == "shop" and "epoch" not in start_line
    assert reconcile.core.logs.current() == {}  # nothing leaks out of the cycle


def test_a_drive_retry_line_names_pipeline_and_epoch(
    lines: Callable[[], list[dict[str, Any]]],
) -> None:
    plan = FaultPlan([Fault("cycle.stage", FaultKind.RETRYABLE)])

    def build() -> CommitCycle:
        return CommitCycle(
            "shop", [MemorySink("a", MemoryStore())], MemoryProgressLog(), faults=plan
        )

    drive(build, [0], lambda e: {"a": []}, retry=RetryPolicy(initial_s=0, max_s=0, jitter_s=0))
    records = lines()
    retry = next(r for r in records if str(r["message"]).startswith("retrying"))
    assert (retry["pipeline"], retry["epoch"], retry["level"]) == ("shop", 0, "WARNING")
    aborted = next(r for r in records if "aborted at stage" in str(r["message"]))
    assert (aborted["pipeline"], aborted["epoch"]) == ("shop", 0)


def test_context_nests_and_is_per_thread() -> None:
    with context(pipeline="p", epoch=1):
        with context(sink="s", epoch=2, xid=None):
            assert current() == {"pipeline": "p", "epoch": 2, "sink": "s"}
        assert current() == {"pipeline": "p", "epoch": 1}
        other: list[dict[str, object]] = []
        t = threading.Thread(target=lambda: other.append(current()))
        t.start()
        t.join()
        assert other == [{}]
    assert current() == {}
    with pytest.raises(ValueError, match="msg"), context(msg="x"):
        pass


def test_extra_wins_over_the_context_and_fields_are_omitted_when_unknown() -> None:
    record = logging.LogRecord("reconcile.x", logging.INFO, "f", 1, "hello %s", ("you",), None)
    record.xid = "7"
    with context(pipeline="p", xid="1"):
        assert ContextFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "hello you" and line["xid"] == "7" and line["pipeline"] == "p"
    assert "epoch" not in line and "sink" not in line


def test_passwords_never_reach_a_line() -> None:
    secret = "hunter2-Secret"
    messages = [
        f"connect to postgresql://app:{secret}@db:5432/shop failed",
        f"bad dsn host=db password={secret} dbname=shop",
        f"bad dsn host=db password='{secret} x' dbname=shop",
        f"query ?sslpassword={secret}&x=1",
    ]
    for message in messages:
        record = logging.LogRecord("reconcile", logging.ERROR, "f", 1, message, (), None)
        for formatter in (JsonFormatter(), reconcile.core.logs.TextFormatter()):
            assert secret not in formatter.format(record), (formatter, message)
    try:
        raise RuntimeError(f"postgresql://u:{secret}@h/db")
    except RuntimeError:
        import sys

        record = logging.LogRecord("reconcile", logging.ERROR, "f", 1, "x", (), sys.exc_info())
    formatted = JsonFormatter().format(record)
    assert secret not in formatted and "RuntimeError" in json.loads(formatted)["exception"]


def test_configure_replaces_only_its_own_handler_and_text_shows_fields() -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    old_level = root.level
    first, second = io.StringIO(), io.StringIO()
    try:
        configure(stream=first, level="DEBUG")
        handler = configure(json=False, level="INFO", stream=second)
        assert [h for h in root.handlers if h not in before] == [handler]
        assert root.level == logging.INFO
        with context(pipeline="shop", epoch=3):
            logging.getLogger("reconcile.cycle").info("hello")
        assert first.getvalue() == ""
        assert "INFO reconcile.cycle [pipeline=shop epoch=3]: hello" in second.getvalue()
        with pytest.raises(ValueError, match="unknown log level"):
            configure(level="LOUD")
    finally:
        for h in [h for h in root.handlers if h not in before]:
            root.removeHandler(h)
        root.setLevel(old_level)


def test_an_epoch_line_counts_arrow_and_staged_rows(caplog: pytest.LogCaptureFixture) -> None:
    # Rows computed on the driver come as an Arrow table, rows staged by Spark
    # executors as a StagedEpoch: both are rows of the epoch, as a list is.
    outputs: dict[str, Any] = {
        "lines": pa.table({"id": [1, 2, 3]}),
        "totals": StagedEpoch("totals", 4, ("id",), ("reconcile", "stage"), ("t0",), rows=7),
        "audit": [{"id": 1}, {"id": 2}],
        "empty": pa.table({"id": pa.array([], pa.int64())}),
    }
    log = logging.getLogger("reconcile.cycle")
    with caplog.at_level(logging.INFO, logger="reconcile.cycle"):
        log_result(log, "shop", 3, CommitSucceeded(4), outputs, 0.0125)
    assert caplog.messages == ["pipeline shop epoch 4 committed: 12 rows, 12.5 ms, generation 3"]
