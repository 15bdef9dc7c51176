"""The optional extras of the distribution, and the error that names a missing one.

The base install holds the engine, the store, recovery and the CLI; a sink
backend or an application that needs more names its extra (``postgres``,
``sql``, ``spark``, ``demo``). Backends say theirs in their declaration
(``sinks.base.Backend.extra``); the applications call :func:`require` where
they start.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from reconcile.core.contract import ConfigurationError

__all__ = ["install_hint", "require"]


def install_hint(extra: str) -> str:
    """The command that installs ``extra``."""
    return f"pip install 'reconcile-engine[{extra}]'"


def require(module: str, *, extra: str, what: str) -> ModuleType:
    """Import ``module``, or say which extra installs it.

    Args:
        module: the module to import (``pyspark``).
        extra: the extra that installs it (``spark``).
        what: what needs it, for the message (``reconcile.spark``).

    Raises:
        ConfigurationError: ``module`` is not installed; the message names
            ``extra`` and the command that installs it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(
            f"{what} needs {module}, which is not installed: {install_hint(extra)}"
        ) from exc
