"""The README and docs/ pages as the docs test reads them: fenced blocks, links, named paths."""

from __future__ import annotations

import glob
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>.*)$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>.+?)\s*-->\s*$")
# A Markdown link or image whose target is not a web address: ](target) or ](target#anchor).
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
# A repository path in backticks: `tests/fix_pg.py`, `benchmarks/results/latency.{json,md}`.
NAMED_PATH = re.compile(
    r"`(?P<path>(?:\.ci|tests|benchmarks|examples|scripts|reconcile|sinks|expected_state|docs)"
    r"/[^`\s]*)`"
)
# A commit hash as a reader would meet it: 7 to 40 hex digits, mixing digits and letters,
# standing alone (not inside a longer word such as 0x7fc00000).
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts, its language and tag, its code, why it is not run."""

    page: Path
    line: int  # the 1-based line of its first code line
    lang: str
    tag: str
    code: str
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def compiled(self) -> object:
        """The code compiled so that a traceback names the page and its real line numbers."""
        return compile("\n" * (self.line - 1) + self.code, str(self.page), "exec")


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(page: Path) -> Iterator[Block]:
    """Every fenced block of ``page``, with the ``<!-- not run: ... -->`` mark above it."""
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        indent = opened.group("indent")
        info = opened.group("info").strip()
        if info.startswith("{"):  # {.python .postgres}: how the docs site takes a tagged block
            lang, _, tag = info.strip("{} ").replace(".", "").partition(" ")
        else:
            lang, _, tag = info.partition(" ")
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        code = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end]) + "\n"
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = NOT_RUN.match(before)
        yield Block(page, i + 2, lang, tag.strip(), code, mark.group("reason") if mark else None)
        i = end + 1


def prose(page: Path) -> str:
    """The page's text outside its fenced blocks."""
    out, inside = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            out.append(line)
    return "\n".join(out)


def slug(title: str) -> str:
    """The anchor of a heading, as mkdocs (python-markdown's toc) and GitHub both make it."""
    from markdown.extensions.toc import slugify

    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")
    return str(slugify(text, "-"))


def anchors(page: Path) -> set[str]:
    """The anchors of every heading of a Markdown page."""
    return {
        slug(m.group("title"))
        for line in prose(page).splitlines()
        if (m := HEADING.match(line)) is not None
    }


def links(page: Path) -> Iterator[str]:
    """Every link target of the page's prose that is not a web address or an e-mail."""
    for match in LINK.finditer(prose(page)):
        target = match.group("target")
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
            yield target


def expand(path: str) -> list[str]:
    """``a.{json,md}`` as ``a.json`` and ``a.md``; a path without braces as itself."""
    parts = re.split(r"\{([^{}]*)\}", path)
    fixed, choices = parts[0::2], [p.split(",") for p in parts[1::2]]
    return [
        "".join(itertools.chain.from_iterable(itertools.zip_longest(fixed, pick, fillvalue="")))
        for pick in itertools.product(*choices)
    ]


def missing_paths(page: Path) -> list[str]:
    """The repository paths the page names in backticks that do not exist."""
    missing = []
    for match in NAMED_PATH.finditer(page.read_text()):
        named = match.group("path").rstrip(".,;:)")
        file_part = named.split("::")[0]
        if "<" in file_part or "..." in file_part:
            continue  # a placeholder, not a path
        for path in expand(file_part):
            found = glob.glob(str(ROOT / path))
            if not found:
                missing.append(named)
            elif "::" in named and named.split("::")[1] not in Path(found[0]).read_text():
                missing.append(named)  # the file is there, the test or fixture it names is not
    return missing


# A dotted name of the engine in backticks: `reconcile.spark.write_stream`, `sinks.sql.SqlSink`.
DOTTED = re.compile(r"`(?P<name>(?:reconcile|sinks|expected_state)(?:\.[A-Za-z_]\w*)+)")
PACKAGES = ("reconcile", "sinks", "expected_state")


def _source_text() -> str:
    return "\n".join(
        path.read_text() for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
    )


def unknown_names(page: Path, source: str, objects: str) -> list[str]:
    """The engine's dotted names the page names that neither import nor occur in the code.

    A name is known when it imports (a module, or an attribute of one); or when the
    code spells it as a string (a hook point such as ``expected_state.apply.checked``,
    a Delta commit field such as ``reconcile.log_id``); or when it is an object of the
    engine's schema ``reconcile`` that ``sinks/objects`` declares
    (``reconcile.reconcile_commits``).
    """
    import importlib

    unknown = []
    for name in sorted({m.group("name") for m in DOTTED.finditer(page.read_text())}):
        parts = name.split(".")
        found = False
        for cut in range(len(parts), 0, -1):
            try:
                obj: object = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attribute in parts[cut:]:
                    obj = getattr(obj, attribute)
                found = True
            except AttributeError:
                pass
            break
        spelled = f'"{name}' in source or f"'{name}" in source
        declared = parts[0] == "reconcile" and len(parts) == 2 and f'"{parts[1]}' in objects
        if not (found or spelled or declared):
            unknown.append(name)
    return unknown


def engine_texts() -> tuple[str, str]:
    """The packages' source, and sinks/objects' alone (where the engine's SQL objects live)."""
    objects = "\n".join(p.read_text() for p in sorted((ROOT / "sinks" / "objects").glob("*.py")))
    return _source_text(), objects
