"""The Kafka backend, as it declares itself to ``sinks.registry``.

A topic used as a table: ``kafka://host:port[,host:port]/TOPIC?key=a,b``. Its
sinks write one Kafka transaction per epoch with a marker in the engine's
marker topic; recovery pulls a compacted topic to its end. It needs the
``kafka`` extra (confluent-kafka).
"""

from __future__ import annotations

from sinks.base import PULLABLE, Backend

__all__ = ["BACKEND"]

BACKEND = Backend(
    name="kafka",
    schemes=("kafka",),
    open="sinks.kafka.factory:open_uri",
    extra="kafka",
    requires=("confluent_kafka",),
    capabilities={PULLABLE: "sinks.kafka.recovery:pullable_sink"},
)
