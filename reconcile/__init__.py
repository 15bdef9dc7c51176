"""reconcile: exactly-once delivery and pull-and-diff reconciliation for data pipelines.

What a pipeline needs is importable from here: the commit cycle and its
results, the progress logs, the driver, the sink contract and its outcomes,
and the errors. Sinks live in ``sinks`` (``sinks.registry.open_sink``), the
expected-state store in ``expected_state``, the sink contract suite in
``reconcile.testing``.
"""

from reconcile.core.contract import (
    OK,
    Change,
    ConfigurationError,
    ContractViolationError,
    EpochOrderError,
    Fatal,
    FatalError,
    FencedError,
    InvalidInputError,
    MarkerMismatchError,
    Ok,
    OutcomeUnknownError,
    ReconcileError,
    RejectedError,
    Retryable,
    RetryableError,
    RowsRejectedError,
    SinkOutcome,
    SinkTxnId,
    TxnIdParseError,
    UnknownSinkError,
    WriterIdentity,
)
from reconcile.core.progress import EpochStatus, MemoryProgressLog, ProgressLog
from reconcile.core.results import (
    CommitAborted,
    CommitFatal,
    CommitResult,
    CommitSucceeded,
    RecoveryReport,
)
from reconcile.core.sink import TwoPhaseSink, check_outcome
from reconcile.engine.cycle import CommitCycle
from reconcile.engine.driver import DriveReport, RetryPolicy, drive
from reconcile.engine.progress_file import FileProgressLog
from reconcile.recovery import Mode, ReconcileReport, recover, recover_sink

__all__ = [
    "OK",
    "Change",
    "CommitAborted",
    "CommitCycle",
    "CommitFatal",
    "CommitResult",
    "CommitSucceeded",
    "ConfigurationError",
    "ContractViolationError",
    "DriveReport",
    "EpochOrderError",
    "EpochStatus",
    "Fatal",
    "FatalError",
    "FencedError",
    "FileProgressLog",
    "InvalidInputError",
    "MarkerMismatchError",
    "MemoryProgressLog",
    "Mode",
    "Ok",
    "OutcomeUnknownError",
    "ProgressLog",
    "ReconcileError",
    "ReconcileReport",
    "RecoveryReport",
    "RejectedError",
    "RetryPolicy",
    "Retryable",
    "RetryableError",
    "RowsRejectedError",
    "SinkOutcome",
    "SinkTxnId",
    "TwoPhaseSink",
    "TxnIdParseError",
    "UnknownSinkError",
    "WriterIdentity",
    "check_outcome",
    "drive",
    "recover",
    "recover_sink",
]

__version__ = "0.1.0"
