"""Benchmarks: throughput and latency harnesses that write reports to benchmarks/results/."""
