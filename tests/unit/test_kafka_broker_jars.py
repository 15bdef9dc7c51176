"""The Kafka broker is started from the venv's JAR cache only: a missing cache names the fix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reconcile.core.contract import ConfigurationError
from reconcile.testing.kafka_broker import broker_jars


def test_the_cache_is_in_the_venv() -> None:
    assert broker_jars() == Path(sys.prefix) / "jars" / "kafka-broker"


def test_a_missing_cache_names_scripts_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(ConfigurationError, match=r"scripts/setup"):
        broker_jars()
