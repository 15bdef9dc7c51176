"""A Kafka sink (confluent-kafka): each epoch ONE Kafka transaction, with its marker.

The sink is ``sinks.kafka.sink.KafkaSink``; ``backend`` declares it to ``sinks.registry``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.base import lazy_exports

if TYPE_CHECKING:
    from .sink import KafkaSink

__all__ = ["KafkaSink"]

__getattr__ = lazy_exports(__name__, {"KafkaSink": "sink"})
