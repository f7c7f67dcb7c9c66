"""README.md and docs/*.md: every relative link reaches a file of the tree, and every anchor into a
page names one of its headings (GitHub's slugs). Figures' links into bench/results/*.json are
checked for their file here and for their number by tests/bench/test_readme_figures.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300  # issue 53: what a new user needs; the rest is in docs/

LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(?P<title>.+?)\s*#*\s*$")
FENCED = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def prose(text: str) -> str:
    """The page without its fenced code blocks and code spans (a link there is not a link)."""
    return re.sub(r"`[^`]+`", "", FENCED.sub("", text))


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link in a heading reads as its text
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: dict[str, int] = {}
    names = set()
    for line in FENCED.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = HEADING.match(line)
        if not match:
            continue
        name = slug(match["title"])
        count = found.get(name, 0)
        found[name] = count + 1
        names.add(name if count == 0 else f"{name}-{count}")
    return names


def dead_links(page: Path, root: Path = REPO_ROOT) -> list[str]:
    dead = []
    for match in LINK.finditer(prose(page.read_text(encoding="utf-8"))):
        target = match["target"]
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            dead.append(f"{page.name}: {target} (no such file)")
        elif root not in resolved.parents:
            dead.append(f"{page.name}: {target} (outside the repository)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            dead.append(f"{page.name}: {target} (no heading #{anchor} in {resolved.name})")
    return dead


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(page: Path):
    assert dead_links(page) == []


def test_readme_is_short_and_links_every_docs_page():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    index = (REPO_ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    linked = {Path(match["target"].partition("#")[0]).name for match in LINK.finditer(prose(index))}
    assert {page.name for page in PAGES[1:] if page.name != "README.md"} <= linked


def test_the_checks_see_dead_links_and_anchors(tmp_path: Path):
    (tmp_path / "a.md").write_text("# A page\n\n## Its `second` part: here\n", encoding="utf-8")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md) [ok](a.md#its-second-part-here) [ok](#b) [gone](c.md) [gone](a.md#nothing) "
        "`[code](c.md)` [web](https://example.org/x)\n# B\n```\n[fenced](d.md)\n```\n",
        encoding="utf-8",
    )
    assert [entry.split(": ", 1)[1] for entry in dead_links(page, root=tmp_path)] == [
        "c.md (no such file)",
        "a.md#nothing (no heading #nothing in a.md)",
    ]
