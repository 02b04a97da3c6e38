"""The docs hold together: every relative link of README.md and docs/ names a file that exists and, for a
Markdown file, a heading it has; the results pages (docs/results.md, the index, and docs/results/*.md) stay
at most 400 lines each."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but - and _ dropped, spaces as -."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_results_are_an_index_and_pages_of_at_most_400_lines():
    pages = [ROOT / "docs" / "results.md", *sorted((ROOT / "docs" / "results").glob("*.md"))]
    assert len(pages) >= 4
    for page in pages:
        lines = page.read_text().count("\n")
        assert lines <= 400, f"{page.relative_to(ROOT)}: {lines} lines"
    index = pages[0].read_text()
    assert all(f"(results/{p.name}" in index for p in pages[1:]), "a page the index does not link"
