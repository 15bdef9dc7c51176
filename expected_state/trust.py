"""Trusting a store table: its commits audited, the footers of the files a read uses checked.

The checks themselves are in ``expected_state.integrity``; this mixin keeps,
for one store object, what was already checked, so that a second read costs
only the commits and files that are new to it.
"""

from __future__ import annotations

from collections.abc import Sequence

from deltalake import DeltaTable

from expected_state.integrity import LogAudit, check_footer, refuse_files
from expected_state.layout import StoreFile
from expected_state.live import live_files

__all__ = ["Trusting"]


class Trusting:
    """Mixin for :class:`~expected_state.store.ExpectedStateStore`: audit, check_files."""

    uri: str
    app_id: str
    _fence: str
    _log_audit: LogAudit | None  # the log replayed so far (built on first use)
    _sound_files: set[str]  # files whose footer matched their log entry

    def _delta(self, *, refresh: bool = True) -> DeltaTable | None:  # provided by the store
        raise NotImplementedError

    def _hold(self, version: int) -> None:  # provided by the store (Holding)
        raise NotImplementedError

    def audit(self, version: int | None = None) -> None:
        """Check the table's commits before its rows are trusted (see ``integrity.py``).

        The log is replayed incrementally (only the commits since the last call
        are read): the files live now, and at ``version`` if given (a time-travel
        read), must be exactly those the engine's own commits left live. Every
        read of rows calls it; recovery calls it before it pulls anything.

        Raises:
            StoreLostRowsError: a commit the engine did not write removed or
                rewrote files the engine wrote (naming them, their epochs and
                the commits).
            StoreIntegrityError: such a commit added a file the engine did not write.
        """
        table = self._delta(refresh=False)
        if table is None:
            return
        if self._log_audit is None:
            self._log_audit = LogAudit(self.uri, frozenset({self.app_id, self._fence}))
        current = table.version()
        self._log_audit.check(current, table=self.uri)
        if version is not None and version != current:
            self._log_audit.check(version, table=self.uri)

    def check_files(self, files: Sequence[StoreFile]) -> None:
        """Check the footers of ``files`` against their log entries before they are read.

        Only the size and the footer of each file are read (a few kilobytes),
        once per file for this object: the cost follows the files a read uses.

        Raises:
            StoreLostRowsError: a file is gone, or its size, row count or
                ``_epoch``/``_row_hash`` bounds differ from its log entry, or it
                holds rows of other epochs than its name says (naming each file).
        """
        self.audit()
        audit = self._log_audit
        entries = audit.entries if audit is not None else {}
        problems = []
        for f in files:
            if f.path in self._sound_files:
                continue
            why = check_footer(self.uri, f, entries.get(f.path))
            if why is None:
                self._sound_files.add(f.path)
            else:
                problems.append((f.path, why))
        refuse_files(self.uri, problems)

    def check_version(self, version: int) -> None:
        """Check what a reader other than the store (a Spark job) reads at ``version``.

        The commits up to now and at ``version``, and the footer of every file
        live at ``version`` (what a plain Delta reader of it reads).

        Raises:
            StoreLostRowsError, StoreIntegrityError: as :meth:`audit` and :meth:`check_files`.
        """
        self._hold(version)  # the Spark job reads it after this: hold it from vacuum
        self.audit(version)
        self.check_files(live_files(DeltaTable(self.uri, version=version), name=self.uri))
