"""The sink author's kit catches what it claims to: broken variants of the docs' sink fail it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconcile.testing import ContractCheckError, check_sink

DOC = Path(__file__).resolve().parents[2] / "docs" / "sinks.md"


def _docs_namespace() -> dict[str, Any]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    # The blocks that define the sink and its harness, wherever the page puts them.
    (sink,) = [b for b in blocks if "class ListSink" in b]
    (harness,) = [b for b in blocks if "class ListHarness" in b]
    namespace: dict[str, Any] = {"__name__": "example_sinks"}
    exec(compile(sink, str(DOC), "exec"), namespace)
    exec(compile(harness.split("report = ")[0], str(DOC), "exec"), namespace)
    return namespace


def _harness_of(sink_class: type) -> Callable[[], Any]:
    base = _docs_namespace()["ListHarness"]

    class Harness(base):  # type: ignore[misc, valid-type]
        def new_sink(self, name: str) -> Any:
            return sink_class(name, self.system)

    return Harness


def test_the_docs_sink_passes_every_check() -> None:
    ns = _docs_namespace()
    report = check_sink(ns["ListHarness"])
    assert report.ok and len(report.passed) >= 60, report.failed


def _broken(**overrides: Callable[..., Any]) -> type:
    sink = _docs_namespace()["ListSink"]
    return type("Broken", (sink,), overrides)


CASES = {
    # Commits an epoch that is already in a second time (a replay writes again).
    "writes-a-committed-epoch-again": (
        {"_in": lambda self, txn: None},
        "committed_epoch",
    ),
    # Never fences a stale generation.
    "no-fence": (
        {
            "_check": lambda self, txn: (
                None if self._in(txn) is None else type(self).__mro__[1]._check(self, txn)
            )
        },
        "stale_generation_cannot_write",
    ),
    # Takes another progress log's commit as its own ("already committed").
    "ignores-the-log-id": ({"bind": lambda self, writer: None}, "another_logs_commit"),
    # A stale writer's abort discards the newer writer's batch.
    "stale-abort-discards": (
        {
            "abort": lambda self, txn: (
                self.system["prepared"].pop(txn.key, None),
                type(self).__mro__[1].abort(self, txn),
            )[1]
        },
        "stale_abort_keeps_the_newer_batch",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_sink_fails_the_check_that_names_its_rule(case: str) -> None:
    overrides, rule = CASES[case]
    with pytest.raises(ContractCheckError, match=rule):
        check_sink(_harness_of(_broken(**overrides)))
