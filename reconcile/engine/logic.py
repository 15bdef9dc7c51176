"""Which logic may write a pipeline: none while a rebuild is unfinished, then the rebuild's.

A rebuild (``reconcile.rebuild``) brings a pipeline's sinks from one logic
version to another in steps; the store's rebuild log
(``expected_state.rebuilds``) names each. A writer that started on a mix of
the two, or that ran the old logic after the switch, would leave sinks that no
single logic explains. So every writer's ``CommitCycle.start()`` asks here
first, before it claims a generation (nothing is written if it is refused).
The log itself is checked before it is believed: a step someone else planted,
or a log deleted under a rebuild that the store's rebases still show, stops
every writer and every rebuild, naming it.
"""

from __future__ import annotations

from collections.abc import Iterable

from expected_state.rebuilds import RebuildLog
from reconcile.core.contract import ConfigurationError

__all__ = ["check_logic"]


def check_logic(
    root: str,
    pipeline: str,
    logic_version: str | None,
    sinks: Iterable[str] = (),
    *,
    rebuilding: bool = False,
) -> None:
    """Refuse a writer on an unfinished rebuild, or with another logic than the pipeline's.

    The rebuild log is checked first, as the store is (``expected_state.rebuild_audit``):
    a step the engine did not write (a planted "switched"), a step or the
    whole log removed while a store table shows a rebase of it, is refused,
    never read as "no rebuild" or "finished".

    Args:
        root: the store root.
        pipeline: the pipeline.
        logic_version: the logic the writer runs; None: not named (a library
            writer), which only the unfinished-rebuild check applies to.
        sinks: the pipeline's tables in the store, whose rebases the log must hold.
        rebuilding: the writer is a rebuild (or its rollback), which starts on
            the mix its own steps left: only the log's own checks apply.

    Raises:
        StoreIntegrityError: the rebuild log cannot be trusted, naming what was found.
        ConfigurationError: naming the rebuild and what to run.
    """
    journal = RebuildLog(root, pipeline)
    journal.check_store(sinks)
    if rebuilding:
        return
    newest = journal.newest()
    if newest is None:
        return
    if not newest.finished:
        raise ConfigurationError(
            f"{newest.describe()} is unfinished: no writer may start on a mix of two logics. "
            "Run `reconcile rebuild --apply` again to finish it, or `reconcile rebuild "
            "--rollback` to go back to the old logic"
        )
    in_force = newest.logic_in_force
    if logic_version is not None and in_force is not None and logic_version != in_force:
        raise ConfigurationError(
            f"pipeline {pipeline!r}: this writer runs logic {logic_version!r}, but its sinks "
            f"hold logic {in_force!r} ({newest.describe()}): run the pipeline with that logic "
            "(the config's run.app, or run.logic_version)"
        )
