"""Rendering shared by every report posbias writes: the diagnoses (`posbias diagnose qa|tagging`), the
experiment report (`posbias experiment report`) and the data statistics.

A report is one `Document`: headings, paragraphs, lists, tables and figures added once, written as
Markdown (`NAME.md`, figures linked) and as a self-contained HTML page (`NAME.html`, figures embedded as
data URIs) with the same content. Paragraphs and headings are Markdown; the page renders the small
inline part of Markdown that reports use (`**bold**`, `` `code` ``, backslash escapes, `&lt;`-style
entities) and escapes everything else. Table cells are plain text (a leading `**number**` is the one
markup a cell may hold: a significant Δ).

User text (class, file, model, method, data set and run names) goes through `md_escape` before it is
placed in Markdown, and through `plot_text` before it is drawn: a `|` adds a table column, `<script>`
is HTML in any Markdown viewer, two `$` make matplotlib parse the text as math (an unknown command
such as `\\undefinedcmd` then fails the whole plot). `pyplot()` gives matplotlib with the Agg backend
and the reports' style (imported on first use: matplotlib is not loaded by `import posbias`).
"""
from __future__ import annotations

import base64
import html
import math
import re
from pathlib import Path
from urllib.parse import quote

from .config import BUNDLED, RESOURCES
from .utils import atomic_write_text

# ------------------------------------------------------------------------------------------ text
# Markdown: a backslash before ASCII punctuation makes it literal (CommonMark §2.4; `~`: GitHub's
# strikethrough; `$`: GitHub's math, and that of viewers with KaTeX or MathJax, where two of them start a
# formula); `<`, `>`, `&` become entities, which every Markdown flavour shows as text (some do not
# honour `\<`). Left alone, as they cannot start markup: `_` between two letters or digits (no
# intraword emphasis with `_`, so "gold_position_quartile" stays readable), `<` not followed by a
# letter, `/`, `!` or `?` (no tag, comment or autolink starts so: "<0.001"), `&` not followed by a
# letter or `#` (no entity).
_MD = re.compile(r"[\\|`*~$\[\]>]|(?<![^\W_])_|_(?![^\W_])|<(?=[A-Za-z/!?])|&(?=[A-Za-z#])|\r\n|[\r\n]")
_MD_SUB = {"<": "&lt;", ">": "&gt;", "&": "&amp;", "\r\n": " ", "\r": " ", "\n": " "}


def md_escape(text) -> str:
    """`text` as literal Markdown inline text: markup characters (`\\ | ` * _ ~ $ [ ] < > &`) escaped,
    line breaks turned into spaces (a table row or heading is one line)."""
    return _MD.sub(lambda m: _MD_SUB.get(m.group(), "\\" + m.group()), str(text))


def plot_text(text) -> str:
    """`text` as literal matplotlib text: every `$` escaped (`\\$`), so that no pair of them starts
    math mode (matplotlib shows `\\$` as `$`; backslashes elsewhere are literal outside math)."""
    return str(text).replace("$", r"\$")


_INLINE = re.compile(r"\\([!-/:-@\[-`{-~])|&(lt|gt|amp);|\*\*(.+?)\*\*|`([^`]*)`", re.S)
_ENTITIES = {"lt": "<", "gt": ">", "amp": "&"}


def inline_html(text: str) -> str:
    """The HTML of one line of report Markdown: `**bold**` and `` `code` `` kept as markup, backslash
    escapes and the three entities `md_escape` writes read back as the characters they stand for,
    and every character of text escaped for HTML (so no user text becomes markup on the page)."""
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos:m.start()]))
        literal, entity, bold, code = m.groups()
        if literal is not None:
            out.append(html.escape(literal))
        elif entity is not None:
            out.append(html.escape(_ENTITIES[entity]))
        elif bold is not None:
            out.append(f"<b>{inline_html(bold)}</b>")
        else:
            out.append(f"<code>{html.escape(code)}</code>")
        pos = m.end()
    out.append(html.escape(text[pos:]))
    return "".join(out)


# ----------------------------------------------------------------------------------------- numbers
def fmt(x, digits: int = 2) -> str:
    """A number in a table cell; `–` for a missing one (None or NaN)."""
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def short_name(x, limit: int = 48) -> str:
    """A model or data name short enough for a plot title: what the user typed when it is short,
    else the last two path components ("…/runs/demo/best" -> "demo/best"; a bundled
    "…/site-packages/posbias/resources/squad/dev.json" -> "squad/dev.json")."""
    text = str(x)
    if len(text) <= limit and "site-packages" not in text:
        return text
    parts = [p for p in text.replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:]) if len(parts) >= 2 else text[-limit:]


def data_label(spec) -> str:
    """How a report names a data set: a bundled one by its alias (`demo:dev`), not the path it
    resolves to inside the installed package; anything else as the user gave it (shards joined
    with ", ")."""
    if isinstance(spec, (list, tuple)):
        return ", ".join(data_label(x) for x in spec)
    text = str(spec)
    for alias, rel in BUNDLED.items():
        if text == alias or _same_file(text, RESOURCES / rel):
            return alias
    return text


def _same_file(text: str, bundled: Path) -> bool:
    try:
        return Path(text).resolve() == bundled.resolve()
    except (OSError, ValueError):  # not a path (a name, a NUL byte)
        return False


# ------------------------------------------------------------------------------------------ tables
_BOLD = re.compile(r"\*\*([+\-−]?\d[\d.,]*)\*\*(.*)", re.S)
"""A cell that starts with a bold number (a significant Δ): the one markup a table cell holds;
everything else in a cell is text."""


def md_table(head, body) -> str:
    """A Markdown table; every cell is escaped (`md_escape`: names from users' files and specs can
    hold `|`, HTML or emphasis), but for a leading bold number."""
    def cell(x):
        m = _BOLD.fullmatch(x)
        return f"**{m.group(1)}**{md_escape(m.group(2))}" if m else md_escape(x)

    lines = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def html_table(head, body) -> str:
    """The same table as `md_table`, as HTML."""
    def cell(x):
        m = _BOLD.fullmatch(x)
        x = f"<b>{html.escape(m.group(1))}</b>{html.escape(m.group(2))}" if m else html.escape(x)
        return f"<td>{x}</td>"

    rows = "".join("<tr>" + "".join(cell(c) for c in row) + "</tr>" for row in body)
    return ("<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + f"</tr></thead><tbody>{rows}</tbody></table>")


# ------------------------------------------------------------------------------------------- pages
WIDE_FIGURE = 900
"""A figure wider than this many pixels (a grid of panels) takes a whole row of `Document.figures`."""


def png_width(data: bytes) -> int | None:
    """The width in pixels of a PNG (its IHDR header), or None for anything else."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big")


def html_figure(title: str, path: Path, rel: str) -> str:
    """A PNG embedded in the page (the HTML file stands alone), captioned; `rel` is its file name."""
    raw = Path(path).read_bytes()
    data = base64.b64encode(raw).decode()
    wide = " class='wide'" if (png_width(raw) or 0) > WIDE_FIGURE else ""
    return (f"<figure{wide}><img alt='{html.escape(title)}' data-file='{html.escape(rel)}' "
            f"src='data:image/png;base64,{data}'><figcaption>{html.escape(title)}</figcaption></figure>")


def html_page(title: str, parts: list[str]) -> str:
    """A self-contained HTML page around already-escaped parts."""
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
             "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}"
             "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f3f3f3}"
             "img{max-width:100%}figure{margin:1.5em 0}figcaption{font-size:0.9em;color:#555}"
             "blockquote.warning{margin:1em 0;padding:0.6em 1em;border-left:5px solid #d97706;"
             "background:#fff7e6;color:#4a2c00}"
             ".figures{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,480px),1fr));gap:1em 2em}"
             ".figures figure{margin:0}.figures figure.wide{grid-column:1/-1}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>")


class Document:
    """One report, built once and written as Markdown and as a self-contained HTML page.

    >>> doc = Document("Position diagnosis of run/best")  # the title is plain text
    >>> doc.heading("Position bias")
    >>> doc.paragraph(f"**{md_escape(verdict)}**")        # paragraphs and headings are Markdown
    >>> doc.table(["segment", "F1"], [["Q1", "61.20"]])    # cells are plain text
    >>> doc.warning("the model scores under the quality floor")  # above the tables it qualifies
    >>> doc.figure("F1 by position", png_path)
    >>> doc.figures([("F1(α)", a_png), ("Per class", b_png)])  # a grid of two per row on the page
    >>> doc.write(folder, "diagnosis")                     # diagnosis.md + diagnosis.html
    """

    def __init__(self, title: str):
        self.title = str(title)
        self._md = [f"# {md_escape(self.title)}", ""]
        self._html = [f"<h1>{html.escape(self.title)}</h1>"]

    def heading(self, text: str, level: int = 2) -> None:
        """A section heading (Markdown text)."""
        self._md += ["#" * level + " " + text, ""]
        self._html.append(f"<h{level}>{inline_html(text)}</h{level}>")

    def paragraph(self, text: str) -> None:
        """A paragraph (Markdown text, one line)."""
        self._md += [text, ""]
        self._html.append(f"<p>{inline_html(text)}</p>")

    def warning(self, text: str) -> None:
        """A warning (Markdown text, one line): a blockquote led by a bold "Warning:", styled as a
        warning on the page. A leading "Warning: " in `text` is not repeated."""
        text = text.removeprefix("Warning: ")
        self._md += [f"> **Warning:** {text}", ""]
        self._html.append(f"<blockquote class='warning'><b>Warning:</b> {inline_html(text)}</blockquote>")

    def bullets(self, items: list[str]) -> None:
        """A list, one Markdown line per item."""
        self._md += [f"- {x}" for x in items] + [""]
        self._html.append("<ul>" + "".join(f"<li>{inline_html(x)}</li>" for x in items) + "</ul>")

    def table(self, head: list[str], body: list[list[str]]) -> None:
        """A table of plain-text cells (`md_table` / `html_table`)."""
        self._md += [md_table(head, body), ""]
        self._html.append(html_table(head, body))

    def figure(self, title: str, path, rel: str | None = None) -> None:
        """A PNG: linked from the Markdown by `rel` (its path relative to the report; default its file
        name), embedded in the page. `title` is plain text."""
        path = Path(path)
        rel = rel or path.name
        self._md += [f"![{md_escape(title)}]({quote(rel)})", ""]
        self._html.append(html_figure(title, path, rel))

    def figures(self, items: list[tuple[str, Path]]) -> None:
        """Several PNGs, `(title, path)` each: one after the other in the Markdown, a grid on the page
        (two per row on a wide screen, one on a narrow one; a figure of several panels, wider than
        `WIDE_FIGURE` pixels, a row of its own), so that each stays legible."""
        if not items:
            return
        parts = []
        for title, path in items:
            path = Path(path)
            self._md += [f"![{md_escape(title)}]({quote(path.name)})", ""]
            parts.append(html_figure(title, path, path.name))
        self._html.append(f"<div class='figures'>{''.join(parts)}</div>")

    def markdown(self) -> str:
        return "\n".join(self._md).rstrip("\n") + "\n"

    def html(self) -> str:
        return html_page(self.title, self._html)

    def write(self, folder, stem: str) -> tuple[Path, Path]:
        """`folder/stem.md` and `folder/stem.html`, each written atomically."""
        folder = Path(folder)
        md, page = folder / f"{stem}.md", folder / f"{stem}.html"
        atomic_write_text(md, self.markdown())
        atomic_write_text(page, self.html())
        return md, page


# ------------------------------------------------------------------------------------------- plots
def pyplot():
    """matplotlib.pyplot with the Agg backend and the reports' style (no LaTeX: a user's matplotlibrc
    may ask for it, and names are drawn as text through `plot_text`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "axes.grid": True, "grid.alpha": 0.3, "text.usetex": False})
    return plt
