"""mkdocs hook: a page's links to repository files outside docs/ work on the site too.

The pages are read on GitHub as well as on the site, so they link files such as
``../examples/reconcile.toml`` or ``../benchmarks/results/latency_cdf.png`` by
their place in the repository. mkdocs only knows the files under docs/: this
hook adds the shared folders' files to the site and points those links at them.
Markdown files of those folders are left out (they are reports, not pages).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
SHARED = ("examples/", "benchmarks/results/")
# The target of a Markdown link or image: ](target) or ](target#anchor).
LINK = re.compile(r"\]\((?P<target>[^)\s#]+)")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add every non-Markdown file of the shared folders, at its repository path."""
    for folder in SHARED:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix != ".md":
                src = path.relative_to(ROOT).as_posix()
                files.append(File(src, str(ROOT), config.site_dir, config.use_directory_urls))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Point links that leave docs/ for a shared folder at the file the site holds."""
    page_dir = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match[str]) -> str:
        target = match.group("target")
        if "://" in target:
            return match.group(0)
        in_repo = posixpath.normpath(posixpath.join("docs", page_dir, target))
        if not in_repo.startswith(SHARED):
            return match.group(0)
        return "](" + posixpath.relpath(in_repo, page_dir or ".")

    return LINK.sub(rewrite, markdown)
