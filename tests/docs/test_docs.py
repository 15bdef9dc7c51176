"""The README and docs/: every code example runs, every link and named path resolves.

Examples. Every fenced block of README.md and docs/**/*.md is read with its info string
and the HTML comment on the line above it:

- the ```python blocks of a page form one program (later blocks use names that earlier
  ones define), run in order in one namespace, from the repository's root;
- the ```{.python .postgres} and ```bash blocks of a page form a second program, run in page
  order against a fresh database of the shared throwaway server (its DSN in ``SHOP_DSN``)
  from a temporary folder; a bash block runs under ``bash -euo pipefail`` with this venv's
  ``reconcile`` first on PATH, so a command that exits non-zero fails the test;
- the ```{.python .spark} blocks of a page form a third, run on the shared Spark session;
- ```toml and ```json blocks must parse;
- a block marked ``<!-- not run: REASON -->`` is not run. ``NOT_RUN`` names every such
  block, so marking one more is a deliberate change of this file; the test prints them.

Links. Every relative link and image of the pages must name a file that exists, and an
anchor into a Markdown page one of its headings. Links to the web are not checked: the
tests run offline. ``mkdocs build --strict`` (in ``.ci/run``) checks the links between the
pages again with the site's own resolver, and builds the API reference.

Paths and names. Every repository path a page names in backticks (``tests/...``,
``benchmarks/...``, ``examples/...``, ``reconcile/...``, ...) must exist, and every dotted
name of the engine (``reconcile.spark.write_stream``) must import or occur in the code, so a
moved file or module cannot leave a stale page behind. And no page may hold a commit hash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import psycopg
import pytest

from tests.docs.pages import (
    COMMIT_HASH,
    ROOT,
    Block,
    anchors,
    blocks,
    engine_texts,
    links,
    missing_paths,
    pages,
    unknown_names,
)

# Every block that is marked not to run, by page and reason. Keep it short: a block that
# can run standalone runs.
NOT_RUN = {
    ("README.md", "the demo takes minutes; CI runs scripts/test itself"),
    ("docs/getting-started.md", "the demo takes minutes; CI runs scripts/test itself"),
    ("docs/spark.md", "needs an importable build function and a streaming DataFrame"),
    ("docs/spark.md", "needs a Spark cluster"),
    ("docs/ha.md", "needs a streaming DataFrame, a Postgres lease and a second instance"),
    ("docs/ha.md", "needs an app module and two long-running processes"),
    ("docs/expected_state.md", "needs polars, which is not a dependency"),
    ("docs/benchmarks.md", "each benchmark runs for minutes"),
    ("docs/getting-started.md", "it installs packages"),
    ("docs/mariadb.md", "needs a MariaDB server"),
    ("docs/kafka.md", "needs a Kafka broker and a pipeline's store"),
}
CODE = {"python", "bash", "sh"}
SHELL = {"bash", "sh"}
# Languages shown, never run: output, SQL the engine runs itself, synopses.
SHOWN = {"text", "sql", "yaml", "toml", "json", ""}

ALL = [block for page in pages() for block in blocks(page)]


def _program(kind: str) -> dict[str, list[Block]]:
    """The blocks to run of one kind, per page, in page order."""
    by_page: dict[str, list[Block]] = {}
    for block in ALL:
        if block.not_run is not None:
            continue
        if kind == "plain":
            chosen = block.lang == "python" and block.tag == ""
        elif kind == "postgres":
            chosen = (block.lang == "python" and block.tag == "postgres") or block.lang in SHELL
        else:
            chosen = block.lang == "python" and block.tag == kind
        if chosen:
            by_page.setdefault(str(block.page.relative_to(ROOT)), []).append(block)
    return by_page


PLAIN, POSTGRES, SPARK = _program("plain"), _program("postgres"), _program("spark")


def _run(block: Block, namespace: dict[str, object], env: dict[str, str] | None = None) -> None:
    if block.lang in SHELL:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.code],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (
            f"{block.where}: exit {done.returncode}\n{block.code}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )
        return
    exec(block.compiled(), namespace)


@pytest.mark.parametrize("page", sorted(PLAIN))
def test_python_examples_run(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the config example reads examples/reconcile.toml
    namespace: dict[str, object] = {"__name__": f"example_{Path(page).stem}"}
    for block in PLAIN[page]:
        _run(block, namespace)


@pytest.mark.integration
@pytest.mark.parametrize("page", sorted(POSTGRES))
def test_postgres_examples_and_commands_run(
    page: str, pg_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHOP_DSN", pg_db)
    venv_bin = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", f"{venv_bin}{os.pathsep}{os.environ['PATH']}")
    namespace: dict[str, object] = {"__name__": f"example_{Path(page).stem}_postgres"}
    for block in POSTGRES[page]:
        _run(block, namespace, env=dict(os.environ))
    # What the examples wrote is in the database, each row once, with the marker beside it.
    with psycopg.connect(pg_db) as conn:
        markers = conn.execute("SELECT count(*) FROM reconcile.reconcile_commits").fetchone()
    assert markers is not None and markers[0] > 0, f"{page}: no epoch reached the database"


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.parametrize("page", sorted(SPARK))
def test_spark_examples_run(page: str, spark: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {"__name__": f"example_{Path(page).stem}_spark"}
    for block in SPARK[page]:  # their getOrCreate() returns the shared session
        _run(block, namespace)


def test_every_code_block_runs_or_is_one_of_the_named_few() -> None:
    marked = {(str(b.page.relative_to(ROOT)), b.not_run) for b in ALL if b.not_run is not None}
    for page, reason in sorted(marked):
        print(f"not run: {page}: {reason}")  # the list, shown with -s or on failure
    assert marked == NOT_RUN, (
        f"marked not to run but not named: {sorted(marked - NOT_RUN)}; "
        f"named but no longer marked: {sorted(NOT_RUN - marked)}"
    )
    unknown = [
        b.where
        for b in ALL
        if not (b.lang in SHOWN or (b.lang in CODE and b.tag in {"", "postgres", "spark"}))
    ]
    assert not unknown, f"blocks of a language or tag the test does not know: {unknown}"
    ran = sum(len(p) for p in (*PLAIN.values(), *POSTGRES.values(), *SPARK.values()))
    # Each not-run block needs a service the docs test does not start (a MariaDB server,
    # a Kafka broker, a cluster) or takes minutes; the list stays short.
    assert ran >= 25 and len(NOT_RUN) <= 11


def test_toml_and_json_blocks_parse() -> None:
    for block in ALL:
        if block.lang == "toml":
            tomllib.loads(block.code)
        elif block.lang == "json":
            json.loads(block.code)


@pytest.mark.parametrize("page", [str(p.relative_to(ROOT)) for p in pages()])
def test_relative_links_and_anchors_resolve(page: str) -> None:
    source = ROOT / page
    broken = []
    for target in links(source):
        path, _, anchor = target.partition("#")
        file = (source.parent / path).resolve() if path else source
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page}: {broken}"


def test_every_named_repository_path_exists() -> None:
    missing = {str(p.relative_to(ROOT)): missing_paths(p) for p in pages()}
    assert not {page: paths for page, paths in missing.items() if paths}


def test_every_named_module_and_object_exists() -> None:
    source, objects = engine_texts()
    unknown = {str(p.relative_to(ROOT)): unknown_names(p, source, objects) for p in pages()}
    assert not {page: names for page, names in unknown.items() if names}


def test_no_commit_hashes() -> None:
    found = {
        f"{page.relative_to(ROOT)}: {match.group(0)}"
        for page in pages()
        for match in COMMIT_HASH.finditer(page.read_text())
    }
    assert not found, sorted(found)


def test_the_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test" in text and "scripts/test" in ci  # CI runs the README's test command
    assert "scripts/demo" in text
    assert "../shared" not in text  # the README stands alone
    for page in ("getting-started", "architecture", "cli", "benchmarks", "testing"):
        assert f"(docs/{page}.md" in text, f"the README does not link docs/{page}.md"


def test_the_readme_synopsis_names_every_command() -> None:
    usage = subprocess.run(
        [str(Path(sys.executable).parent / "reconcile"), "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    commands = usage.split("{", 1)[1].split("}", 1)[0].split(",")
    synopsis = next(b.code for b in blocks(ROOT / "README.md") if b.code.startswith("reconcile "))
    shown = {line.split()[1].split("|")[0] for line in synopsis.splitlines() if line}
    assert len(commands) >= 7 and shown == set(commands)
