"""The ``reconcile`` command line and its TOML config: run, verify, repair, watch, status, demo."""

from reconcile.cli.command import main

__all__ = ["main"]
