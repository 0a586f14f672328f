"""The README stays a manual and every link between it and docs/ resolves.

A link is a Markdown `[text](target)` whose target is a relative path (optionally with a
`#anchor`, which is not checked); web links are not followed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MAX_README_LINES = 300



def broken_links(text: str, folder: Path) -> list[str]:
    """Relative link targets of a Markdown page in `folder` that name no existing file or folder."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (folder / target.split("#")[0]).resolve()
        if not path.exists():
            broken.append(target)
    return broken


def test_readme_is_a_manual_of_at_most_300_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= MAX_README_LINES


def test_links_of_the_readme_and_docs_resolve():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert {page.name: broken for page in pages
            if (broken := broken_links(page.read_text(), page.parent))} == {}


def test_a_broken_link_is_found():
    text = ("[ok](metric.md) [anchor](metric.md#which-score-to-trust) [web](https://dvc.org) "
            "[up](../README.md#experiments) [gone](no_such_page.md) [engine](engine.md)\n")
    assert broken_links(text, ROOT / "docs") == ["no_such_page.md"]
