"""reconcile: exactly-once delivery and pull-and-diff reconciliation for data pipelines."""

from reconcile.contract import (
    OK,
    Change,
    Fatal,
    FatalError,
    InvalidInputError,
    Ok,
    OutcomeUnknownError,
    ReconcileError,
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
)

__all__ = [
    "OK",
    "Change",
    "Fatal",
    "FatalError",
    "InvalidInputError",
    "Ok",
    "OutcomeUnknownError",
    "ReconcileError",
    "Retryable",
    "RetryableError",
    "SinkOutcome",
    "SinkTxnId",
]

__version__ = "0.1.0"
