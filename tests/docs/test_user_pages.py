"""User pages (README.md and the site's guides, concepts and hand-written reference) tell what is,
not its history: no issue numbers and no dates. History lives in CHANGELOG.md, measurements with
their dates in the results pages."""
from __future__ import annotations

import re

import pytest

from . import ROOT

DOCS = ROOT / "docs"
# Not user guides: the results pages (dated measurements), the generated reference, and what the
# site does not build (archived stores, the hook).
SKIP = ("results/", "experiments/", "diagnoses/", "hooks/")
HISTORY = {
    "issue number": re.compile(r"\bissues?\s+#?\d+", re.I),
    "#N issue reference": re.compile(r"(?<![\w&/#.\-])#\d+\b"),
    "date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
}


def user_pages() -> list:
    pages = [ROOT / "README.md"] if (ROOT / "README.md").is_file() else []
    for path in sorted(DOCS.rglob("*.md")):
        rel = path.relative_to(DOCS).as_posix()
        if not rel.startswith(SKIP):
            pages.append(path)
    return pages


def history(text: str) -> list[str]:
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for what, pattern in HISTORY.items():
            found += [f"line {n}: {what} {m.group(0)!r}" for m in pattern.finditer(line)]
    return found


def test_the_check_finds_issue_numbers_and_dates():
    assert len(history("Fixed in issue 29 (#31), run on 2026-11-25.")) == 3
    assert history("See [the tables](config.md#qa-train), `&#123;`, RFC 3339, 2,000 steps, F1(α=10).") == []


@pytest.mark.parametrize("page", user_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_user_pages_carry_no_issue_numbers_or_dates(page):
    found = history(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)}:\n" + "\n".join(found)
