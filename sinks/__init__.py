"""Sinks: the two-phase-commit contract and its implementations (memory, files, http, ...)."""
