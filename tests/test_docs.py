"""The README and docs/ point at files and headings that exist (a moved section or a renamed
heading breaks a link silently otherwise), and the README stays a few screens long."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as '-', repeats numbered."""
    found: set[str] = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        m = None if in_code else re.match(r"^#{1,6} (.*)", line)
        if m:
            base = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchor, n = base, 1
            while anchor in found:
                anchor, n = f"{base}-{n}", n + 1
            found.add(anchor)
    return found


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_reaches_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no such heading")
    assert not broken, broken


def test_the_readme_fits_on_a_few_screens_and_links_every_doc() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    linked = {t.partition("#")[0] for t in links(REPO / "README.md")}
    unlinked = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in linked]
    assert not unlinked, f"docs not linked from the README: {unlinked}"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title here\n[ok](a.md#title-here) [gone](b.md) [no](a.md#nope)\n")
    page = tmp_path / "a.md"
    assert anchors(page) == {"title-here"}
    assert links(page) == ["a.md#title-here", "b.md", "a.md#nope"]
