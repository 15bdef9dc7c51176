"""reconcile: exactly-once delivery and pull-and-diff reconciliation for data pipelines.

What a pipeline needs is importable from here: the commit cycle and its
results, the progress logs, the driver, the sink contract and its outcomes,
and the errors. Sinks live in ``sinks`` (``sinks.registry.open_sink``), the
expected-state store in ``expected_state``, the sink contract suite in
``reconcile.testing``.
"""

from reconcile.contract import (
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
    Retryable,
    RetryableError,
    SinkOutcome,
    SinkTxnId,
    TxnIdParseError,
    UnknownSinkError,
    WriterIdentity,
)
from reconcile.cycle import CommitCycle
from reconcile.driver import DriveReport, RetryPolicy, drive
from reconcile.progress import EpochStatus, MemoryProgressLog, ProgressLog
from reconcile.progress_file import FileProgressLog
from reconcile.recovery import Mode, ReconcileReport, recover, recover_sink
from reconcile.results import (
    CommitAborted,
    CommitFatal,
    CommitResult,
    CommitSucceeded,
    RecoveryReport,
)
from reconcile.sink import TwoPhaseSink, check_outcome

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
    "RetryPolicy",
    "Retryable",
    "RetryableError",
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
