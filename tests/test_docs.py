"""The README and docs/ describe the project as it is: no history wording, and every relative link
reaches a file (and, with a ``#fragment``, one of its headings). History belongs in CHANGELOG.md,
which this does not read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

HISTORY = re.compile(r"\bprevious\b|\bissue\s*#?\s*\d+|\blast stop\b|\bthis stop\b|\bthis session\b", re.IGNORECASE)
"""Words that date a page: they send the reader to a moment or a tracker rather than the code."""

FOREIGN_ISSUE = re.compile(r"\b[A-Z][\w-]+ issue\s*#?\s*\d+")
"""Another project's issue named with that project ("MetaQA issue #1") is a source, not history."""

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _prose(text: str) -> str:
    """The page without its fenced code blocks (commands and their output are not links or prose)."""
    return FENCE.sub("", text)


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens
    (an underscore inside a word, as in a config key, stays; one that marks emphasis goes)."""
    text = re.sub(r"[`*]|(?<!\w)_|_(?!\w)|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in _prose(page.read_text(encoding="utf-8")).splitlines()
            if line.startswith("#")}


def test_pages_are_found():
    assert ROOT / "README.md" in PAGES and len(PAGES) > 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_has_no_history_wording(page):
    text = FOREIGN_ISSUE.sub("", page.read_text(encoding="utf-8"))
    found = [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1) for m in HISTORY.finditer(line)]
    assert not found, f"{page.relative_to(ROOT)}: history wording (it goes to CHANGELOG.md) at {found}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:: not checked offline
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (fragment and dest.suffix == ".md" and fragment not in _anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links that reach no file or heading: {broken}"
