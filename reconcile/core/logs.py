"""Structured logs: every engine line names its pipeline, sink, epoch and xid, as fields.

The engine keeps a *log context* (a ``contextvars`` value): the commit cycle
sets ``pipeline`` and ``epoch`` while ``start()`` and ``run_epoch()`` run, the
cycle's sink steps add ``sink`` and ``txn`` around each sink call, and a sink
names its ``xid`` on the lines that have one (``extra={"xid": ...}``). The
:class:`ContextFilter`, attached to a handler, copies the context onto every
record that passes through it, so no call site repeats them; a field given
with ``extra`` wins over the context.

For an application, one call sets it all up::

    import reconcile.core.logs
    reconcile.core.logs.configure(json=True, level="INFO")  # one JSON object per line

Or add ``ContextFilter()`` and ``JsonFormatter()`` to a handler of your own.

Secrets: the engine redacts passwords where it builds a message (the sinks
redact every DSN and server error). The formatters here also scrub anything
secret-shaped from the finished line (``reconcile.core.redaction.scrub``: a
URI's password, a secret-named parameter or property, of any scheme), as a
second net for messages written by other code (an application logging a
connection error, say).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import sys
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO, Concatenate, ParamSpec, Protocol, TypeVar

from reconcile.core.metrics import Metrics, activate
from reconcile.core.redaction import scrub

__all__ = [
    "FIELDS",
    "ContextFilter",
    "JsonFormatter",
    "TextFormatter",
    "configure",
    "context",
    "current",
    "scrub",
    "within_cycle",
]

# The fields the engine names, in the order a line shows them.
FIELDS = ("pipeline", "sink", "epoch", "txn", "xid", "generation")

# Attributes every LogRecord has: a context field of one of these names would
# overwrite the record's own (logging refuses the same names in ``extra``).
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
}

_CONTEXT: ContextVar[Mapping[str, object] | None] = ContextVar(
    "reconcile_log_context", default=None
)


def current() -> dict[str, object]:
    """The log context of this thread or task (a copy)."""
    return dict(_CONTEXT.get() or {})


class context:  # used as a function: ``with context(sink=...):``
    """Add ``fields`` to the log context inside the block (None values are left out).

    A class rather than a generator-based context manager: it wraps every sink
    call of every epoch, so it is kept to a dict merge and a contextvar set.

    Raises:
        ValueError: a field would overwrite a LogRecord attribute (``name``, ``msg``, ...).
    """

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: object) -> None:
        if not _RECORD_ATTRS.isdisjoint(fields):
            clash = sorted(set(fields) & _RECORD_ATTRS)
            raise ValueError(f"log context field(s) {clash} would overwrite LogRecord attributes")
        self._fields = {k: v for k, v in fields.items() if v is not None}

    def __enter__(self) -> None:
        self._token = _CONTEXT.set({**(_CONTEXT.get() or {}), **self._fields})

    def __exit__(self, *exc: object) -> None:
        _CONTEXT.reset(self._token)


class ContextFilter(logging.Filter):
    """Copies the log context onto each record (fields given with ``extra`` win).

    Attach it to a *handler*: a logger's filters see only records logged on
    that very logger, a handler's see every record it handles, in the thread
    that logged it (so the context is the right one).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_CONTEXT.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: getattr(record, k) for k in FIELDS if getattr(record, k, None) is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, then the engine's fields.

    Written here rather than taken from python-json-logger: the whole of it is
    the dozen lines below, and the secrets scrub must run on the message and
    the traceback before they are encoded, which is simplest where the line is
    made.
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": scrub(record.getMessage()),
            **_fields(record),
        }
        if record.exc_info:
            line["exception"] = scrub(self.formatException(record.exc_info))
        if record.stack_info:
            line["stack"] = scrub(self.formatStack(record.stack_info))
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger [pipeline=... epoch=...] message``, secrets scrubbed."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(reconcile_fields)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        record.reconcile_fields = f" [{fields}]" if fields else ""
        return scrub(super().format(record))


_HANDLER_MARK = "_reconcile_configured"


def configure(
    *, json: bool = False, level: str | int = "INFO", stream: IO[str] | None = None
) -> logging.Handler:
    """Log to ``stream`` (stderr) through the root logger, with the engine's fields.

    Calling it again replaces the handler it installed before, and no other.

    Args:
        json: one JSON object per line (:class:`JsonFormatter`); else text.
        level: the root logger's level (a name such as ``"INFO"`` or a number).
        stream: where lines go (default: sys.stderr).

    Returns:
        The handler it installed.

    Raises:
        ValueError: an unknown level name.
    """
    if isinstance(level, str):
        number = logging.getLevelName(level.upper())
        if not isinstance(number, int):
            raise ValueError(f"unknown log level {level!r}")
        level = number
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    return handler


# ------------------------------------------------------------ the cycle's scope


class _Cycle(Protocol):
    pipeline: str
    metrics: Metrics
    generation: int | None


S = TypeVar("S", bound=_Cycle)
P = ParamSpec("P")
R = TypeVar("R")


def within_cycle(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Run a cycle method with its metrics active and its pipeline (and epoch) in the log context.

    Decorates ``CommitCycle.start`` and ``run_epoch``: the epoch is the
    method's argument named ``epoch``, if it has one.
    """
    # The epoch's position among the positional arguments after self, found
    # once here: binding the signature on every call would cost more than the rest.
    names = list(inspect.signature(method).parameters)[1:]
    at = names.index("epoch") if "epoch" in names else None

    @functools.wraps(method)
    def scoped(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        epoch = None
        if at is not None:
            epoch = args[at] if len(args) > at else kwargs.get("epoch")
        with (
            activate(self.metrics),
            context(pipeline=self.pipeline, epoch=epoch, generation=self.generation),
        ):
            return method(self, *args, **kwargs)

    return scoped
