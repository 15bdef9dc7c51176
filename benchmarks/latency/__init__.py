"""Benchmark: event-to-visible latency of one streaming workload under three write modes.

``python -m benchmarks.latency`` runs it; ``main`` is :func:`benchmarks.latency.bench.main`.
"""

from benchmarks.latency.bench import main

__all__ = ["main"]
