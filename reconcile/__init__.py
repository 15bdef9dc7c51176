"""reconcile: exactly-once delivery and pull-and-diff reconciliation for data pipelines.

What a pipeline needs is importable from here: the commit cycle and its
results, the progress logs, the driver, the sink contract and its outcomes,
and the errors. Sinks live in ``sinks`` (``sinks.registry.open_sink``), the
expected-state store in ``expected_state``, the sink contract suite in
``reconcile.testing``.
"""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
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

# The recovery API is loaded on first use, not here. ``expected_state`` and
# ``sinks`` build on this package's core modules (``reconcile.core.contract`` and
# its kin), and ``reconcile.recovery`` builds on ``expected_state``: importing
# it eagerly would run it while a lower module that merely asked for
# ``reconcile.core.contract`` is still half-initialised, a circular import that
# breaks ``import sinks.delta`` or ``import expected_state.delta_files`` in a
# fresh interpreter.
_LAZY = {
    "Mode": "reconcile.recovery",
    "ReconcileReport": "reconcile.recovery",
    "recover": "reconcile.recovery",
    "recover_sink": "reconcile.recovery",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reconcile' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value
