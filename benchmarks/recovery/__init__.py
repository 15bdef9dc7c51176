"""Benchmark: pull-and-diff recovery on PostgreSQL (full, scoped, buckets), raw COPY, reladiff.

``python -m benchmarks.recovery`` runs it; ``main`` is :func:`benchmarks.recovery.bench.main`.
"""

from benchmarks.recovery.bench import main

__all__ = ["main"]
