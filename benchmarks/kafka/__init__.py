"""Benchmark: Kafka -> Spark -> PostgreSQL exactly once against at least once, and the Kafka sink.

``python -m benchmarks.kafka`` runs it; ``main`` is :func:`benchmarks.kafka.bench.main`.
"""

from benchmarks.kafka.bench import main

__all__ = ["main"]
