"""Writer fencing by generation, recorded as a Delta app transaction inside each commit."""

from __future__ import annotations

from deltalake import DeltaTable

from expected_state.delta_log import transaction_version
from reconcile.core.contract import FencedError, InvalidInputError

__all__ = [
    "check_generation",
    "check_recorded_generation",
    "fence_app_id",
    "rebuild_app_id",
    "validate_generation",
]

# Why a Delta app transaction and not a fence file: the generation token is
# written in the SAME atomic log entry as the data it guards, so "check the
# fence" and "write" cannot be separated by a take-over. The race:
#
#   zombie (g1) reads fence = 1         new writer (g2) commits token g2
#   zombie commits data + token g1  ->  delta-rs' conflict checker sees that a
#                                       commit it did not read carries the same
#                                       app id and fails the zombie's commit
#                                       ("Concurrent transaction failed"), even
#                                       after its bounded internal retries.
#
# The zombie then re-reads the fence, finds g2 > g1 and gets FencedError; its
# data files stay orphans that vacuum removes. The same shared token also makes
# any two concurrent commits of one writer's table conflict, which serialises
# read-modify-write commits (no lost upsert between two processes).


def fence_app_id(pipeline: str, sink: str) -> str:
    """The app id under which a (pipeline, sink) writer records its generation."""
    return f"{pipeline}/{sink}#generation"


def rebuild_app_id(pipeline: str, sink: str) -> str:
    """The app id under which a rebase records its rebuild: the rebuild log's "started" step.

    ``expected_state.rebuild_audit`` refuses a store table that carries it for
    a rebuild the rebuild log does not hold (a log deleted under a rebuild).
    """
    return f"{pipeline}/{sink}#rebuild"


def validate_generation(generation: object) -> int:
    """Return ``generation`` if it is an int >= 0.

    Raises:
        InvalidInputError: naming the value.
    """
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise InvalidInputError(
            f"writer generation must be an int >= 0, got {generation!r}; nothing was written",
            value=repr(generation),
        )
    return generation


def check_generation(table: DeltaTable, app_id: str, generation: int, *, table_name: str) -> None:
    """Reject a writer whose generation is older than the one the table records.

    Raises:
        FencedError: naming the table, both generations, and that nothing was written.
    """
    recorded = transaction_version(table, app_id)
    check_recorded_generation(recorded, generation, table_name=table_name)


def check_recorded_generation(recorded: int | None, generation: int, *, table_name: str) -> None:
    """Reject ``generation`` if ``recorded`` (read from a snapshot) is newer.

    Raises:
        FencedError: naming the table, both generations, and that nothing was written.
    """
    if recorded is not None and recorded > generation:
        raise FencedError(
            f"table {table_name!r}: writer generation {generation} is fenced off by generation "
            f"{recorded}, which has taken over; nothing was written",
            table=table_name,
            generation=generation,
            recorded_generation=recorded,
        )
