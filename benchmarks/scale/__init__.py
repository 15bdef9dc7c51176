"""Benchmark at scale: a full verify of TPC-H lineitem in bounded memory, and a day of epochs.

``python -m benchmarks.scale`` runs it; ``main`` is :func:`benchmarks.scale.bench.main`.
"""

from benchmarks.scale.bench import main

__all__ = ["main"]
