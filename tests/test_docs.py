"""The README and docs/ point only at what exists: every relative link names a file of the repository and, with
an anchor, a heading of that page (as GitHub makes anchors); and nothing points at a document users do not have."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def without_code(text: str) -> str:
    """The page without its fenced code blocks (a ``#`` there is a comment, not a heading)."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(line.lstrip("#")) for line in without_code(page.read_text(encoding="utf-8")).splitlines()
            if line.startswith("#")}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(without_code(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not ours to check
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (fragment and linked.suffix == ".md" and fragment not in anchors(linked)):
            broken.append(target)
    return broken


def test_anchors_follow_github_s_rule():
    assert anchor("Serving Phi-3.5-mini") == "serving-phi-35-mini"
    assert anchor("Keys, limits and usage") == "keys-limits-and-usage"
    assert anchor("`BATCH_INVARIANT=true` (the default): same") == "batch_invarianttrue-the-default-same"


def test_the_link_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) [no heading](#nowhere)\n", encoding="utf-8")
    assert broken_links(page) == ["missing.md", "#nowhere"]


def test_every_link_of_the_readme_and_docs_resolves():
    assert {page.name: broken_links(page) for page in PAGES if broken_links(page)} == {}


def test_no_page_points_at_documents_users_do_not_have():
    words = re.compile(r"\b(the spec|the specification|seeds/|\.\./shared)\b", re.I)
    assert {page.name: words.findall(page.read_text(encoding="utf-8")) for page in PAGES
            if words.search(page.read_text(encoding="utf-8"))} == {}


def test_the_readme_is_a_newcomer_s_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 150
    headings = [line[3:] for line in readme.splitlines() if line.startswith("## ")]
    assert headings[:3] == ["Prerequisites", "Quickstart", "Serving Phi-3.5-mini"]
