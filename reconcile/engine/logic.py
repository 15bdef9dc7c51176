"""Which logic may write a pipeline: none while a rebuild is unfinished, then the rebuild's.

A rebuild (``reconcile.rebuild``) brings a pipeline's sinks from one logic
version to another in steps; the store's rebuild log
(``expected_state.rebuilds``) names each. A writer that started on a mix of
the two, or that ran the old logic after the switch, would leave sinks that no
single logic explains. So every writer's ``CommitCycle.start()`` asks here
first, before it claims a generation (nothing is written if it is refused).
"""

from __future__ import annotations

from expected_state.rebuilds import RebuildLog
from reconcile.core.contract import ConfigurationError

__all__ = ["check_logic"]


def check_logic(root: str, pipeline: str, logic_version: str | None) -> None:
    """Refuse a writer on an unfinished rebuild, or with another logic than the pipeline's.

    Args:
        root: the store root.
        pipeline: the pipeline.
        logic_version: the logic the writer runs; None: not named (a library
            writer), which only the unfinished-rebuild check applies to.

    Raises:
        ConfigurationError: naming the rebuild and what to run.
    """
    newest = RebuildLog(root, pipeline).newest()
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
