"""Every object the engine creates in a user's database: declared, created and checked here only.

The objects (``declared.py`` holds each one's DDL and expected definition):

- the schema ``reconcile``, the engine's own (or the sink's ``state_schema=``,
  the lease's ``schema=``);
- in it, the markers ``reconcile_commits``, the fences ``reconcile_fences``,
  the repairs ``reconcile_repairs``, the leases ``reconcile_leases``, and the
  executors' staging tables ``_reconcile_stage_<digest>`` (one per pipeline,
  sink and target; UNLOGGED);
- a session's temp tables ``pg_temp._reconcile_{u,d}_<digest>`` (transactional
  mode);
- on request (``create_epoch_column=True``), the target's ``_epoch`` column
  and its index, which lives in the target's schema as every index does;
- the generic SQL sink's ``reconcile_sql_*`` tables and its temp table
  (``sql_state.py``).

Nothing is imported here: the SQL sink uses ``sql_state`` without psycopg, and
the Postgres objects need psycopg (the ``postgres`` extra). Import each from
its module.

The rule (``postgres.py``, ``stages.py``, ``epoch_column.py``; the catalog in ``catalog.py``):

- Created schema-qualified, never found through the search_path; temp tables
  qualified ``pg_temp``.
- Created in one transaction with the revocation of every privilege that
  default privileges gave another role, so that no other role ever holds one.
- Checked before use, at every bind: owner (the engine's role, or a role named
  ``state_owner=``), kind, persistence, exact columns and primary key, no
  triggers, no rules, no row-level security or policies, and no grant to any
  other role, reads included; the schema's owner must be trusted, and no other
  role may have USAGE or CREATE on it. An object that fails is refused with a
  ConfigurationError naming it and every finding. Nothing is created in a
  schema that fails.
- Temp tables need no check: only their own session can reach them.

**No fallback to the target's schema.** Where the role may not create
``reconcile``, the sink used to keep its tables in the target's schema. That
schema is shared by design: the target's readers have USAGE on it, and before
PostgreSQL 15 every role may CREATE in ``public``. With the schema check above
such a schema is refused anyway, so the fallback could only ever produce a
refusal later, at a worse moment. So a role that cannot create ``reconcile``
gets a ConfigurationError at once, saying what to do (``CREATE SCHEMA
reconcile AUTHORIZATION <role>``, or ``state_schema=``). Tables an older
version placed in the target's schema are still found there (the markers of a
database are never split over two schemas), and checked the same way; the
refusal then says how to move them.

The SQL sink's tables are declared here (``sql_state.py``) and, on MySQL and
MariaDB, checked here at every bind (``sql_checks.py``: kind, InnoDB, columns
and their types, triggers, and every other user's grants as the server's grant
tables list them); the PostgreSQL catalog check does not apply to them, as
that sink speaks any database SQLAlchemy speaks.
"""
