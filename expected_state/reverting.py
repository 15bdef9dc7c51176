"""Reverting a store table's newest epoch: its change file out, its token back, in one commit."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from deltalake import DeltaTable

from expected_state.delta_commit import BasedOn, DataFile, DeltaCommit, commit_files
from expected_state.fencing import check_generation
from expected_state.live import base_through, live_files
from reconcile.core import hooks
from reconcile.core.contract import EpochOrderError, InvalidInputError, RetryableError

__all__ = ["REVERT_CHECKED", "Reverting"]

# Between revert()'s checks (newest epoch, fence) and its commit.
REVERT_CHECKED = hooks.declare("expected_state.revert.checked")

# A revert that lost to a concurrent commit of the same writer (a compaction)
# wrote nothing: it is decided again on a fresh snapshot.
_COMMIT_ATTEMPTS = 3


class Reverting:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: ``revert()``."""

    uri: str
    app_id: str
    generation: int
    _fence: str
    _schema: pa.Schema | None
    _history_from: int
    _delta: Callable[..., DeltaTable | None]
    _token: Callable[[DeltaTable], int | None]
    _stored_schema: Callable[[pa.Schema], pa.Schema]

    def epoch_versions(self) -> dict[int, int]:  # provided by the store
        raise NotImplementedError

    def revert(self, epoch: int) -> bool:
        """Undo ``apply(epoch)`` in ONE fenced commit, so that the epoch can be applied again.

        Removes the epoch's change file and moves the table's token back to the
        previous recorded epoch (-1 if there is none), in the same commit: a
        re-run of the epoch, with the same changes or others, is then recorded
        as if the first run had never been, and the two are never mixed.

        Args:
            epoch: the epoch to revert: the newest one applied.

        Returns:
            True if this call reverted it; False if it is not recorded (never
            applied, or reverted already): revert is idempotent.

        Raises:
            EpochOrderError: ``epoch`` is not the newest epoch applied; nothing was written.
            InvalidInputError: the epoch was folded into the base by ``compact()``.
            FencedError: a newer generation has taken over; nothing was written.
            RetryableError: lost to concurrent writers too often; nothing was written.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidInputError(
                f"table {self.uri!r}: epoch must be an int >= 0, got {epoch!r}; "
                "nothing was written",
                table=self.uri,
                value=repr(epoch),
            )
        for attempt in range(_COMMIT_ATTEMPTS):
            table = self._delta()
            last = None if table is None else self._token(table)
            if table is None or last is None or epoch > last:
                return False  # never applied, or reverted already
            if epoch < last:
                raise EpochOrderError(
                    f"table {self.uri!r}: cannot revert epoch {epoch}: only the newest epoch "
                    f"applied ({last}) can be reverted; nothing was written",
                    table=self.uri,
                    epoch=epoch,
                    last_epoch=last,
                )
            check_generation(table, self._fence, self.generation, table_name=self.uri)
            files = live_files(table, name=self.uri)
            mine = [f for f in files if f.kind == "change" and f.first == f.epoch == epoch]
            through = base_through(files)
            merged = any(f.merged and f.first <= epoch <= f.epoch for f in files)
            if merged or (not mine and through is not None and through >= epoch):
                raise InvalidInputError(
                    f"table {self.uri!r}: epoch {epoch} was folded into the base or merged "
                    "with other epochs by compaction and can no longer be reverted; "
                    "nothing was written",
                    table=self.uri,
                    epoch=epoch,
                )
            earlier = [e for e in self.epoch_versions() if e < epoch]
            if earlier:
                previous = max(earlier)
            elif self._history_from > 0:
                # vacuum pruned the log: the epoch before is no longer listed. Assume
                # no gap rather than claim that nothing was ever recorded.
                previous = epoch - 1
            else:
                previous = -1
            assert self._schema is not None

            def landed() -> bool:
                fresh = self._token(DeltaTable(self.uri))
                return fresh is None or fresh < epoch

            hooks.point(REVERT_CHECKED)
            try:
                revert = DeltaCommit(
                    table_uri=self.uri,
                    schema=self._stored_schema(self._schema),
                    app_id=self.app_id,
                    version=previous,  # the token moves back: the epoch may run again
                    remove=[DataFile(f.path, f.size, 0, "", 0) for f in mine],
                    fence=(self._fence, self.generation),
                    custom_metadata={
                        "reconcile.reverted": epoch,
                        "reconcile.generation": self.generation,
                    },
                )
                result = commit_files(revert, BasedOn(table, landed=landed))
            except RetryableError:
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise
                continue
            return result.committed
        raise AssertionError("unreachable")  # pragma: no cover
