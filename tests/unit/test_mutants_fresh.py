"""Every named mutant still applies: its ``find`` text occurs exactly once, and it compiles.

The mutation check (``python -m tests.mutation``, the last step of CI) fails
on a stale mutant too, but only after its half-hour run; moving code into
another module must fail the default suite at once.
"""

from __future__ import annotations

from pathlib import Path

from tests.mutation import load_mutants

REPO = Path(__file__).resolve().parents[2]


def test_every_mutant_finds_its_code_exactly_once() -> None:
    mutants = load_mutants()
    assert len(mutants) > 100  # the catalogue was read
    stale = {}
    for m in mutants:
        path = REPO / m.file
        count = path.read_text().count(m.find) if path.exists() else 0
        if count != 1:
            stale[m.name] = f"{m.file}: `find` occurs {count} times"
    assert stale == {}


def test_every_mutant_of_python_code_compiles() -> None:
    # A mutant that does not compile fails every test at import, so its kill tests
    # never run; the mutation check counts it as surviving half an hour later.
    broken = {}
    for m in load_mutants():
        path = REPO / m.file
        if path.suffix != ".py" or not path.exists():
            continue
        try:
            compile(path.read_text().replace(m.find, m.replace), str(path), "exec")
        except SyntaxError as err:
            broken[m.name] = f"{m.file}:{err.lineno}: {err.msg}"
    assert broken == {}
