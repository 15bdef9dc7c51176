"""The sink benchmarks, one command: every sink measured alike in one run, PostgreSQL beside each.

``python -m benchmarks.sinks`` runs it; ``main`` is :func:`benchmarks.sinks.bench.main`.
"""

from benchmarks.sinks.bench import main

__all__ = ["main"]
