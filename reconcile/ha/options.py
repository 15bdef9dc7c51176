"""How an HA node runs: its role, what it reports, and the options of its streaming query."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reconcile.core.metrics import Metrics
from reconcile.ha.leading import Role
from reconcile.spark.options import StreamKeywords, StreamOptions

__all__ = ["HaKeywords", "HaOptions"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HaOptions(StreamOptions):
    """The options of an ``HaNode``: those of its streaming query, and its own.

    The query's options (checkpoint, staging, outputs, trigger, query_name,
    retry, via, collect_max_bytes) are as for ``write_stream``; the checkpoint
    is shared with the other instance.

    Attributes:
        role: "main" or "standby".
        metrics: where leadership is reported: ``ha.leader`` (1 while this
            instance leads), ``ha.generation``, ``ha.tenure``,
            ``ha.following_epoch``, ``ha.takeovers``, ``ha.step_downs``
            (label ``reason``) and ``ha.takeover`` (seconds from taking the
            lease to the first epoch committed), ``ha.warm`` (seconds a
            standby's warm-up took).
        on_event: called with (event, fields) at each change of role, and
            with "ready" once a standby has warmed its Spark.
        warm: whether a standby warms its Spark while it waits
            (``reconcile.spark.warm``: each transform is run on an empty
            batch; transforms must not have side effects).
    """

    role: Role | str = Role.MAIN
    metrics: Metrics | None = None
    on_event: Callable[[str, dict[str, Any]], None] | None = None
    warm: bool = True


class HaKeywords(StreamKeywords, total=False):
    """The keywords of :class:`HaOptions`, for ``**options`` (see its attributes)."""

    role: Role | str
    metrics: Metrics | None
    on_event: Callable[[str, dict[str, Any]], None] | None
    warm: bool
