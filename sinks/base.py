"""The sink contract, re-exported for sinks: it lives in the core, in ``reconcile.core.sink``."""

from reconcile.core.sink import (
    SinkCapabilities,
    TwoPhaseSink,
    bind_writer,
    capabilities_of,
    check_outcome,
    has_durable_prepare,
)

__all__ = [
    "SinkCapabilities",
    "TwoPhaseSink",
    "bind_writer",
    "capabilities_of",
    "check_outcome",
    "has_durable_prepare",
]
