"""Every object the engine can create in a database is declared in ``sinks.objects``.

The engine's source is scanned for what could create one: SQL string literals
that begin with ``CREATE ...`` or ``ALTER TABLE ... ADD``, and SQLAlchemy
``create_all(...)`` / ``.create(...)`` calls. One outside ``sinks/objects``
fails this test, unless it is one of the few exceptions below, each said why;
inside, every statement must be one of ``declared.DDL``, the list the checks
are built from.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sinks.objects.declared import DDL

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("reconcile", "sinks", "expected_state")
HOME = "sinks/objects/"

_KINDS = (
    r"TABLE|INDEX|SCHEMA|VIEW|FUNCTION|PROCEDURE|TRIGGER|SEQUENCE|TYPE|DOMAIN|ROLE|USER|GROUP"
    r"|DATABASE|EXTENSION|RULE|POLICY|PUBLICATION|SUBSCRIPTION|SERVER|AGGREGATE|OPERATOR"
    r"|COLLATION|STATISTICS|TABLESPACE|CAST|CONVERSION|LANGUAGE|ACCESS\s+METHOD|TEXT\s+SEARCH"
    r"|FOREIGN"
)
_MODIFIERS = r"(?:(?:OR\s+REPLACE|GLOBAL|LOCAL|TEMP|TEMPORARY|UNLOGGED|UNIQUE|MATERIALIZED"
_MODIFIERS += r"|RECURSIVE|CONSTRAINT|EVENT)\s+)*"
CREATES = re.compile(rf"^\s*CREATE\s+{_MODIFIERS}(?:{_KINDS})\b", re.IGNORECASE)
ADDS = re.compile(r"^\s*ALTER\s+TABLE\b.*\bADD\s+(?:COLUMN|CONSTRAINT)\b", re.IGNORECASE | re.S)

# Statements outside sinks/objects that create something, each allowed for a reason.
EXCEPTIONS = {
    # The demo's own target tables: the user's tables in the demo, which the
    # engine writes as a sink writes any target; not objects of the engine.
    ("reconcile/demo/tpch/data.py", "CREATE TABLE IF NOT EXISTS public.demo_lineitem ("),
    ("reconcile/demo/tpch/data.py", "CREATE TABLE IF NOT EXISTS public.demo_customer_revenue ("),
    ("reconcile/demo/tpch/realtime.py", "CREATE TABLE {} ({})"),  # demo_lineitem_rt
    # The embedded server's databases: a server the engine starts for itself
    # (demo, benchmarks, tests), never a user's.
    ("reconcile/demo/embedded_pg.py", "CREATE DATABASE {} TEMPLATE template0 STRATEGY file_copy"),
    # Schema evolution: a column of the user's own target table that the
    # pipeline's output gained (docs/changing.md), added in the epoch's txn
    # after the fence check; the user's column, not an object of the engine.
    ("sinks/postgres/evolution.py", "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}"),
    # Not a statement: the name delta-rs gives a table's creating commit in its
    # commitInfo, which the store's audit compares with.
    ("expected_state/integrity.py", "CREATE TABLE"),
}
# SQLAlchemy-style create calls outside sinks/objects, each allowed for a reason:
# a Delta table of the expected-state store is files in the store's folder,
# not an object in a database; the Iceberg sink's intent file is a file it
# writes through the table's FileIO (pyiceberg's OutputFile.create), not a
# database object.
CALL_EXCEPTIONS = {"DeltaTable.create", "intent_file.create"}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's with ``{}`` for each value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            parts.append(value.value if isinstance(value, ast.Constant) else "{}")
        return "".join(str(p) for p in parts)
    return None


def _callee(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in ("create", "create_all"):
        owner = func.value
        prefix = owner.id if isinstance(owner, ast.Name) else "<expr>"
        return f"{prefix}.{func.attr}"
    return None


def scan() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(file, statement) of every creating SQL literal; (file, callee) of every create call."""
    statements, calls = [], []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            tree = ast.parse(path.read_text(), filename=rel)
            skip = _docstrings(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.JoinedStr):
                    skip.update(id(v) for v in node.values)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and (callee := _callee(node)):
                    calls.append((rel, callee))
                if id(node) in skip:
                    continue
                text = _text(node)
                if text is not None and (CREATES.match(text) or ADDS.match(text)):
                    statements.append((rel, text))
    return statements, calls


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0]


def test_every_create_the_engine_can_issue_is_declared_in_one_place() -> None:
    statements, _ = scan()
    outside = [(rel, text.strip()) for rel, text in statements if not rel.startswith(HOME)]
    excepted = {
        (rel, start) for rel, text in outside for f, start in EXCEPTIONS
        if rel == f and text.startswith(start)
    }  # fmt: skip
    unexcused = [
        (rel, _first_line(text)) for rel, text in outside
        if not any(rel == f and text.startswith(start) for f, start in EXCEPTIONS)
    ]  # fmt: skip
    assert unexcused == [], (
        "a statement creates an object outside sinks/objects: declare it in "
        "sinks/objects/declared.py and create it through sinks.objects"
    )
    assert excepted == EXCEPTIONS, "an exception no longer matches: remove it"
    inside = [text for rel, text in statements if rel.startswith(HOME)]
    undeclared = [text for text in inside if text not in DDL]
    assert undeclared == [], "a statement in sinks/objects is not in declared.DDL"
    # The scan sees what it must: every declared statement, once, where declared.
    assert sorted(inside) == sorted(DDL)


def test_every_sqlalchemy_create_call_is_in_one_place() -> None:
    _, calls = scan()
    outside = {(rel, callee) for rel, callee in calls if not rel.startswith(HOME)}
    assert {callee for _, callee in outside} <= CALL_EXCEPTIONS, sorted(outside)
    assert {rel for rel, _ in outside} <= {
        "expected_state/store_table.py",
        "expected_state/delta_commit.py",
        "expected_state/epoch_rows.py",
        "sinks/iceberg/prepared.py",
    }
    inside = sorted(callee for rel, callee in calls if rel.startswith(HOME))
    assert inside == ["metadata.create_all", "table.create"]  # sql_state.py


def test_the_scan_finds_creates_in_every_form() -> None:
    """The patterns themselves: what they must catch, and prose they must leave alone."""
    caught = [
        "CREATE TABLE t (x int)",
        "\n  create unlogged table if not exists s.t AS SELECT 1",
        "CREATE TEMP TABLE IF NOT EXISTS {} ON COMMIT DELETE ROWS AS SELECT 1",
        "CREATE OR REPLACE FUNCTION f() RETURNS int",
        "CREATE UNIQUE INDEX i ON t (x)",
        "CREATE EVENT TRIGGER e ON ddl_command_end EXECUTE FUNCTION f()",
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} bigint",
    ]
    left = [
        "Create the table if absent.",
        "Grant CREATE on schema x to the role",
        "create the tables that are missing",
        "ALTER TABLE t SET SCHEMA reconcile",
    ]
    assert all(CREATES.match(t) or ADDS.match(t) for t in caught)
    assert not any(CREATES.match(t) or ADDS.match(t) for t in left)
