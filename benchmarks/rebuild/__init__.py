"""Rebuild by diff beside truncate-and-reload and a side-table swap, on one 10M-row table.

``python -m benchmarks.rebuild`` runs it; ``main`` is :func:`benchmarks.rebuild.bench.main`.
"""

from benchmarks.rebuild.bench import main

__all__ = ["main"]
