"""``reconcile.recover``: bring sink tables to their expected state, by pull-and-diff.

Two entries:

- :func:`recover` takes a connection string, the store's root, the pipeline and
  the tables: what an operator (``reconcile verify`` / ``repair``) or a
  restarted pipeline calls;
- :func:`recover_sink` takes a sink client the commit cycle already holds
  (bound to its writer) and the writer's generation: what ``start()`` calls
  for a sink that is behind or whose outcome is unknown.

The sink client comes from ``sinks.registry``: the backend of the connection
string provides it (PostgreSQL's fast path: COPY into Arrow through ADBC,
checksums in the database); with ``fast_path=False``, or for any other
database, the generic backend does (SQLAlchemy Core, ``sinks.sql``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from expected_state.store import ExpectedStateStore
from reconcile.core import interrupts
from reconcile.core.contract import ConfigurationError, validate_name
from reconcile.core.expected import ExpectedStore
from reconcile.core.target import PullableSink, RecoveryTarget, is_pullable
from reconcile.recovery.brake import DEFAULT_MAX_CHANGE_FRACTION
from reconcile.recovery.engine import reconcile_table
from reconcile.recovery.modes import Mode
from reconcile.recovery.options import RecoverKeywords, RecoverOptions
from reconcile.recovery.report import ReconcileReport
from sinks import registry
from sinks.base import PULLABLE

__all__ = ["recover", "recover_sink"]


def _store(root: str, pipeline: str, table: str, keys: Sequence[str]) -> ExpectedStore:
    return ExpectedStateStore(root, pipeline, table, list(keys))


def _target(
    dsn: str,
    pipeline: str,
    table: str,
    *,
    write: bool,
    fast_path: bool,
    schema: str | None,
    keys: Sequence[str] | None,
    name: str,
) -> tuple[Any, RecoveryTarget]:
    """A sink client for ``table`` (named ``name`` in its markers) and its recovery target.

    The backend of ``dsn`` provides the client; without the fast path, or when
    that backend cannot be pulled from, the generic one (SQLAlchemy) does.
    """
    try:
        backend = registry.backend_for(dsn)
    except ConfigurationError:
        backend = None  # no backend names the URL: the generic driver may still reach it
    if backend is not None and not backend.generic and PULLABLE not in backend.capabilities:
        # A sink that cannot be pulled from (files, HTTP): the generic SQL driver
        # cannot reach it either, so refuse it by name rather than misread its URL.
        registry.capability(dsn, PULLABLE)  # raises, naming the backends that can
    generic = not fast_path or backend is None or PULLABLE not in backend.capabilities
    pullable = registry.capability(dsn, PULLABLE, generic=generic)
    sink: PullableSink = pullable(dsn, table, name=name, schema=schema, key=keys)
    return sink, sink.recovery_target(pipeline, None, write=write)


def recover(
    dsn: str, store: str, pipeline: str, table: str, **options: Unpack[RecoverKeywords]
) -> ReconcileReport:
    """Bring a sink table to its expected state: pull, hash, diff, apply only the difference.

    Pull what the sink holds (every row, only what could have
    changed since its newest marker, or only the key ranges whose checksums
    differ), hash it with the canonical row hash, diff it by key and hash with
    the expected state at the target epoch, and apply the missing, extra and
    changed rows in ONE sink transaction with the marker. Running it again
    applies nothing.

    Args:
        dsn: the sink database: a libpq DSN or URL, or an SQLAlchemy URL
            (``postgresql+psycopg://``, ``sqlite:///path``, ...).
        store: the expected-state store's root.
        pipeline: the pipeline's name.
        table: the sink table (its store table, and its sink name in the
            markers, have the same name). Call once per table.
        **options: the keywords of :class:`~reconcile.recovery.options.RecoverOptions`:
            ``mode``, ``dry_run``, ``after_crash``, ``target_epoch``, ``keys``,
            ``schema``, ``fast_path``, ``progress``, ``sink``, ``since_epoch``,
            ``max_change_fraction``, ``allow_mass_change``, ``chunk_rows``,
            ``spill_dir``, ``provenance_rows``.

    Returns:
        What was pulled, compared, found and applied.

    Raises:
        InvalidInputError: a table not in the store, a store schema that no
            longer matches the sink (the column is named), scoped mode without
            ``_epoch`` or a marker; nothing was written.
        StoreIntegrityError: the store holds what the engine did not write;
            StoreLostRowsError when it lost rows (the files and epochs are
            named); nothing was pulled or written.
        MassChangeError: the repair would delete or change more than
            ``max_change_fraction`` of the table; nothing was written.
        ConfigurationError: the database cannot be reached with these settings
            (the password is redacted), the table is missing or has no key, a
            mode or a ``max_change_fraction`` that is not one.
        RetryableError: the database is unreachable now, or epochs kept
            committing during every attempt.
    """
    recovery = RecoverOptions(**options)
    validate_name("pipeline", pipeline)
    recovery.chosen_mode()
    recovery.brake()  # checked before connecting
    name = validate_name("sink", recovery.sink if recovery.sink is not None else table)
    client, target = _target(
        dsn,
        pipeline,
        table,
        write=not recovery.dry_run,
        fast_path=recovery.fast_path,
        schema=recovery.schema,
        keys=recovery.keys,
        name=name,
    )
    # An interruption names the table (schema-qualified once the engine knows it).
    step = interrupts.step("the verify" if recovery.dry_run else "the repair", table=table)
    try:
        with step:
            keys = recovery.keys
            key_columns = list(keys) if keys is not None else target.key_columns()
            return reconcile_table(target, _store(store, pipeline, name, key_columns), recovery)
    finally:
        client.close()


def recover_sink(
    sink: object,
    store: ExpectedStore,
    generation: int,
    *,
    mode: Mode | str = Mode.AUTO,
    after_crash: bool = True,
    dry_run: bool = False,
    target_epoch: int | None = None,
    max_change_fraction: float = DEFAULT_MAX_CHANGE_FRACTION,
) -> ReconcileReport:
    """Bring a sink the commit cycle holds to its store's state (what ``start()`` calls).

    The repair runs as the writer of ``generation``: inside its transaction
    the fence row is locked and checked (a newer generation makes it fail with
    FencedError; an older one is fenced off, as an epoch does), and the markers
    it writes carry the bound writer's progress-log id.

    Args:
        sink: a pullable sink client, bound to the pipeline's writer
            (``PostgresSink``, ``sinks.sql.sink.SqlSink``).
        store: the ``ExpectedStateStore`` of that sink's table.
        generation: the writer generation the cycle claimed.
        mode: as for :func:`recover`; auto after a crash prefers scoped.
        after_crash: True from ``start()``.
        dry_run: only report.
        target_epoch: default the store's newest epoch.
        max_change_fraction: the mass-change brake, as for :func:`recover`. It
            is never lifted here: the epochs a sink lacks are not counted, so
            a brake that fires means drift or a damaged store, for an operator.

    Raises:
        ConfigurationError: the sink cannot be pulled from (not pullable).
        FencedError: a newer writer holds the sink.
        (and as :func:`recover`)
    """
    if not is_pullable(sink):
        raise ConfigurationError(
            f"sink {getattr(sink, 'name', sink)!r} cannot be pulled from (its capabilities "
            "say pullable=False): pull-and-diff recovery needs a pullable sink"
        )
    pipeline = sink.pipeline or store.pipeline
    target = sink.recovery_target(pipeline, generation, write=not dry_run)
    options = RecoverOptions(
        mode=mode,
        after_crash=after_crash,
        dry_run=dry_run,
        target_epoch=target_epoch,
        max_change_fraction=max_change_fraction,  # never lifted here: see above
    )
    with interrupts.step("the recovery", table=sink.name or store.sink):
        return reconcile_table(target, store, options)
