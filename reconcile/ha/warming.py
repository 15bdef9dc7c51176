"""A standby's warm-up of Spark, run in a thread now and then (``reconcile.spark.warm``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from reconcile.spark.warm import WARM_EVERY_S, warm_up

__all__ = ["StandbyWarmUp"]

log = logging.getLogger("reconcile.ha")


class StandbyWarmUp:
    """Warms Spark in a thread, at most every ``WARM_EVERY_S``, so that a takeover runs warm.

    Trying for the lease never waits on it: ``poke`` only starts a thread.

    Args:
        df: the streaming DataFrame.
        outputs: the transforms per sink (None: the batch as it is).
        pipeline: for the messages.
        warmed: called with the seconds each warm-up took.
    """

    def __init__(
        self,
        df: Any,
        outputs: Mapping[str, Any] | None,
        pipeline: str,
        warmed: Callable[[float], None],
    ) -> None:
        self.df, self.outputs, self.pipeline, self.warmed = df, outputs, pipeline, warmed
        self._at: float | None = None  # time.monotonic() of the last warm-up
        self._thread: threading.Thread | None = None

    def poke(self, sinks: list[str], following_epoch: int | None) -> None:
        """Start a warm-up of the batch after ``following_epoch``, unless one is recent or runs."""
        if self._thread is not None and self._thread.is_alive():
            return
        if self._at is not None and time.monotonic() - self._at < WARM_EVERY_S:
            return
        self._at = time.monotonic()
        batch_id = following_epoch + 1 if following_epoch is not None else 0
        self._thread = threading.Thread(target=self._run, args=(sinks, batch_id),
                                        name="reconcile-warm", daemon=True)  # fmt: skip
        self._thread.start()

    def _run(self, sinks: list[str], batch_id: int) -> None:

        try:
            took = warm_up(self.df, sinks, self.outputs, batch_id=batch_id)
        except Exception as exc:  # warming only saves time: a failure costs a slower takeover
            log.warning("pipeline %s: could not warm Spark: %r", self.pipeline, exc)
            return
        self.warmed(took)
