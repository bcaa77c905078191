"""README.md is read on the repository's own page, where only committed files exist: every relative link
in it must name a file or folder of the repository (not a page the site build generates)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_readme_link_names_a_file_of_the_repository():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+://|#|mailto:", t)]
    assert links
    missing = [t for t in links if not (ROOT / t.split("#", 1)[0]).exists()]
    assert missing == [], missing
