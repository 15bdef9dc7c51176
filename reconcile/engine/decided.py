"""What the store decided, as a sink asks for it: the progress log read when a record is found.

The coordinator binds every sink to a ``WriterIdentity`` carrying a
:class:`ProgressDecisions` (``Restart.bind_sinks``). A sink that finds a
"committed" or "repair" record asks it for the bound the record is held to
(``reconcile.core.claims``): the newest epoch the progress log decided, and
the newest writer generation it granted.
"""

from __future__ import annotations

from reconcile.core.claims import Decided
from reconcile.core.progress import ProgressLog

__all__ = ["ProgressDecisions"]


class ProgressDecisions:
    """The ``Decisions`` of one pipeline: its progress log, read at each question.

    Read at each question, never cached: an epoch decided since start-up is
    within the bound, and so is a record that a newer writer generation of
    the same pipeline wrote (the stale writer that meets it is refused by the
    fence, not taken for a victim of a forgery).
    """

    def __init__(self, progress: ProgressLog) -> None:
        self.progress = progress

    def decided(self) -> Decided:
        """The newest decided epoch and the newest granted generation, as the log holds them now."""
        return Decided(
            epoch=self.progress.last_committed(),
            generation=self.progress.newest_generation(),
        )
