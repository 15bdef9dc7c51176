"""What the streaming writer hands each sink: the transforms of a micro-batch, and its rows.

A transform maps a micro-batch's DataFrame (and, if it takes two arguments,
the batch id) to one sink's DataFrame, or to a ``pyarrow.Table`` of rows it
computed on the driver itself (a small aggregate it collected and merged with
state: no Spark job is left for the writer to run). ``outputs_of`` gives
``Driver.run`` the rows of the micro-batch being written, and an error, never
an empty batch, for an earlier one whose micro-batch Spark will not compute
again.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from reconcile.core.contract import ConfigurationError, FatalError

__all__ = ["Transform", "apply_transform", "identity", "outputs_of"]

# A micro-batch DataFrame (and, if the function takes two arguments, its batch
# id) -> a sink's DataFrame, or a pyarrow.Table of its rows.
Transform = Callable[..., Any]


def outputs_of(
    pipeline: str, batch_id: int, staged: Mapping[str, pa.Table]
) -> Callable[[int], Mapping[str, Iterable[Any]]]:
    """``Driver.run``'s outputs: the staged rows for this batch, ``_Gone`` for any other."""

    def outputs(epoch: int) -> Mapping[str, Iterable[Any]]:
        if epoch == batch_id:
            return staged
        return _Gone(pipeline, epoch, batch_id)

    return outputs


def identity(batch: Any) -> Any:
    """The micro-batch as it is (a sink without a transform of its own)."""
    return batch


def apply_transform(transform: Transform, batch: Any, batch_id: int, *, sink: str = "") -> Any:
    """``transform(batch)``, or ``transform(batch, batch_id)`` if it takes two arguments.

    The batch id lets a transform read state as of the epoch before (a running
    total from the expected state at ``batch_id - 1``), which a re-run of the
    batch reads the same.

    Returns:
        A DataFrame, or a ``pyarrow.Table`` of rows the transform computed.

    Raises:
        ConfigurationError: the transform returned anything else (named with ``sink``).
    """
    try:
        parameters = inspect.signature(transform).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: one argument
        frame = transform(batch)
    else:
        positional = [
            p for p in parameters
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]  # fmt: skip
        frame = transform(batch, batch_id) if len(positional) >= 2 else transform(batch)
    # Checked here, not where the frame is first used: a None or a pandas frame
    # would otherwise fail deep in staging, with no word of which sink.
    if not isinstance(frame, pa.Table) and not hasattr(frame, "sparkSession"):
        raise ConfigurationError(
            f"the transform of sink {sink!r} returned {type(frame).__name__}; a transform "
            "returns a Spark DataFrame or a pyarrow.Table"
        )
    return frame


class _Gone(Mapping[str, Iterable[Any]]):
    """The outputs of an earlier micro-batch, which Spark will not compute again.

    Asked for only when a restart finds an earlier epoch committed in the log
    and missing from a sink without a durable prepare: a sink with an expected
    state is given the recorded rows instead and never asks; any other sink
    would get nothing, so asking is an error, never an empty batch.
    """

    def __init__(self, pipeline: str, epoch: int, batch_id: int) -> None:
        self.pipeline, self.epoch, self.batch_id = pipeline, epoch, batch_id

    def __getitem__(self, sink: str) -> Iterable[Any]:
        raise FatalError(
            f"pipeline {self.pipeline!r}: epoch {self.epoch} is committed but not in sink "
            f"{sink!r}, and its micro-batch is gone (the stream is at batch {self.batch_id}); "
            "give the sink an expected state (keys) so that its recorded rows can be replayed",
            epoch=self.epoch,
        )

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0
