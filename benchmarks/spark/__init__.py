"""Benchmark: the engine on Spark, next to the in-process engine, in one run on the same data.

``python -m benchmarks.spark`` runs it; ``main`` is :func:`benchmarks.spark.bench.main`.
"""

from benchmarks.spark.bench import main

__all__ = ["main"]
