"""The ``kafka://`` URI of a config file or ``open_uri``: no credentials in it, never shown."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from reconcile.core.contract import ConfigurationError
from sinks.kafka.factory import brokers_of, open_uri

SECRET = "s3cr3t-pw"


@pytest.mark.parametrize(
    "opened",
    [
        lambda: brokers_of("orders", f"kafka://alice:{SECRET}@b1:9092,b2:9092"),
        lambda: open_uri("orders", f"kafka://alice:{SECRET}@b1:9092/orders?key=id"),
    ],
)
def test_a_kafka_uri_with_credentials_is_refused_without_showing_them(
    opened: Callable[[], object],
) -> None:
    with pytest.raises(ConfigurationError, match="takes no credentials") as err:
        opened()
    assert SECRET not in str(err.value)
    assert "orders" in str(err.value)


def test_brokers_and_marker_topic_of_a_kafka_uri() -> None:
    assert brokers_of("orders", "kafka://b1:9092,b2:9092?marker_topic=m") == (
        "b1:9092,b2:9092",
        "m",
    )
