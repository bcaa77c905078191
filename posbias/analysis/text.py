"""User text in reports: escaped for Markdown and for matplotlib.

Class, file, model, method, data set and run names come from users' files and specs. Placed
raw into a report they change it: a `|` adds a table column, `<script>` is HTML in any Markdown
viewer, and two `$` make matplotlib parse the text as math (an unknown command such as
`\\undefinedcmd` then fails the whole plot). Every report and plot passes such text through one
of the two functions here. HTML pages are built with `html.escape` directly (not from Markdown).
"""
from __future__ import annotations

import re

# Markdown: a backslash before ASCII punctuation makes it literal (CommonMark §2.4; `~`: GitHub's
# strikethrough); `<`, `>`, `&`
# become entities, which every Markdown flavour shows as text (some do not honour `\<`). Left
# alone, as they cannot start markup: `_` between two letters or digits (no intraword emphasis
# with `_`, so "gold_position_quartile" stays readable), `<` not followed by a letter, `/`, `!` or
# `?` (no tag, comment or autolink starts so: "<0.001"), `&` not followed by a letter or `#` (no
# entity).
_MD = re.compile(r"[\\|`*~\[\]>]|(?<![^\W_])_|_(?![^\W_])|<(?=[A-Za-z/!?])|&(?=[A-Za-z#])|\r\n|[\r\n]")
_MD_SUB = {"<": "&lt;", ">": "&gt;", "&": "&amp;", "\r\n": " ", "\r": " ", "\n": " "}


def md_escape(text) -> str:
    """`text` as literal Markdown inline text: markup characters (`\\ | ` * _ ~ [ ] < > &`) escaped,
    line breaks turned into spaces (a table row or heading is one line)."""
    return _MD.sub(lambda m: _MD_SUB.get(m.group(), "\\" + m.group()), str(text))


def plot_text(text) -> str:
    """`text` as literal matplotlib text: every `$` escaped (`\\$`), so that no pair of them starts
    math mode (matplotlib shows `\\$` as `$`; backslashes elsewhere are literal outside math)."""
    return str(text).replace("$", r"\$")
