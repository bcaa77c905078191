"""`posbias.render`: the one rendering module the diagnoses, the experiment report and the data
statistics share (Markdown and a self-contained HTML page from one `Document`)."""
from __future__ import annotations

import ast
import base64
import html
from pathlib import Path

import pytest

import posbias
from posbias.render import Document, inline_html, md_escape, md_table

PACKAGE = Path(posbias.__file__).parent


@pytest.mark.parametrize("md, page", [
    ("plain text", "plain text"),
    ("**61.2** F1", "<b>61.2</b> F1"),
    ("`val` is `data.eval_file`", "<code>val</code> is <code>data.eval_file</code>"),
    ("Q1 [0,96) <0.001 & more", "Q1 [0,96) &lt;0.001 &amp; more"),
    ("a\\|b and \\*x\\*", "a|b and *x*"),
    ("**bold with \\* inside**", "<b>bold with * inside</b>"),
])
def test_inline_markdown_to_html(md, page):
    assert inline_html(md) == page


@pytest.mark.parametrize("text", ["<script>alert(1)</script>", "x|<b>y</b>", "$\\undefinedcmd$", "a**b**c",
                                  "`tick`", "&amp; &lt;", "under_score _lead trail_", "back\\slash"])
def test_user_text_reads_back_as_itself_on_the_page(text):
    """What `md_escape` makes of user text shows on the page as the text itself: never markup."""
    assert inline_html(md_escape(text)) == html.escape(text)


def test_a_document_writes_the_same_content_twice(tmp_path):
    png = tmp_path / "curve.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nnot really a png")
    doc = Document("Diagnosis of <my|model>")
    doc.heading("Position bias")
    doc.paragraph(f"**{md_escape('rear < front')}**")
    doc.bullets(["one `a`", md_escape("two <b>")])
    doc.table(["segment", "F1"], [["Q1", "**+1.5** (p 0.01)"], ["a|b", "–"]])
    doc.figure("F1 by position", png)
    md_path, page_path = doc.write(tmp_path, "report")
    md, page = md_path.read_text(encoding="utf-8"), page_path.read_text(encoding="utf-8")
    assert md.splitlines()[:5] == ["# Diagnosis of &lt;my\\|model&gt;", "", "## Position bias", "",
                                   "**rear < front**"]
    assert md_table(["segment", "F1"], [["Q1", "**+1.5** (p 0.01)"], ["a|b", "–"]]) in md
    assert "![F1 by position](curve.png)" in md and md.endswith("\n") and not md.endswith("\n\n")
    assert "<title>Diagnosis of &lt;my|model&gt;</title>" in page
    assert page.index("<h2>Position bias</h2>") < page.index("<p><b>rear &lt; front</b></p>") < page.index("<ul>")
    assert "<li>one <code>a</code></li><li>two &lt;b&gt;</li>" in page
    assert "<td><b>+1.5</b> (p 0.01)</td>" in page and "<td>a|b</td>" in page
    assert base64.b64encode(png.read_bytes()).decode() in page and "<b>" not in md.split("**")[0]


def _builds_html(path: Path) -> list[str]:
    """Where a module writes HTML markup itself: string constants holding a tag."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if any(tag in node.value for tag in ("<table", "<h1>", "<h2>", "<p>", "<figure", "<html")):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_only_the_rendering_module_writes_html():
    """Diagnoses and the experiment report build their pages through `Document`: no module but
    `posbias.render` spells out HTML (one escaping rule, one page style)."""
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path.name != "render.py" for hit in _builds_html(path)]
    assert not found, found
