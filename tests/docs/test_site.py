"""The documentation site builds with --strict and works offline: no page loads a script, style
or font from outside the site."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import ROOT

# What a browser would fetch on its own when a page loads (a plain <a href> to a paper is not).
EXTERNAL = "(?:[a-z][a-z0-9+.-]*:)?//"
FETCHES = {
    "<script src>": re.compile(r"<script\b[^>]*\bsrc\s*=\s*[\"']?(" + EXTERNAL + r"[^\"'\s>]+)", re.I),
    "<link href>": re.compile(r"<link\b[^>]*\bhref\s*=\s*[\"']?(" + EXTERNAL + r"[^\"'\s>]+)", re.I),
    "<img src>": re.compile(r"<(?:img|iframe|source|video|audio)\b[^>]*\bsrc\s*=\s*[\"']?(" + EXTERNAL + r"[^\"'\s>]+)",
                            re.I),
    "@import": re.compile(r"@import\s+(?:url\(\s*)?[\"']?(" + EXTERNAL + r"[^\"'\s)]+)", re.I),
    "url()": re.compile(r"\burl\(\s*[\"']?(" + EXTERNAL + r"[^\"'\s)]+)", re.I),
    "font": re.compile(r"((?:https?:)?//fonts\.(?:googleapis|gstatic)\.com[^\"'\s)]*)", re.I),
}


def external_fetches(site: Path) -> list[str]:
    """`file: kind url` for every outside resource a page of `site` would load."""
    found = []
    for path in sorted(site.rglob("*")):
        if path.suffix not in (".html", ".css", ".js") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for kind, pattern in FETCHES.items():
            found += [f"{path.relative_to(site)}: {kind} {m.group(1)}" for m in pattern.finditer(text)]
    return found


def test_the_scan_finds_outside_resources(tmp_path):
    (tmp_path / "a.html").write_text('<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
                                     '<script src="//cdn.example.org/x.js"></script><a href="https://arxiv.org">p</a>'
                                     '<script src="assets/local.js"></script>')
    (tmp_path / "b.css").write_text('@import "https://x.org/y.css"; .a{background:url(https://x.org/i.png)}'
                                    '.b{background:url(img/local.png)}')
    found = external_fetches(tmp_path)
    assert len([f for f in found if "fonts.googleapis" in f]) == 2  # as <link href> and as a font
    assert any("//cdn.example.org/x.js" in f for f in found)
    assert any(f.startswith("b.css: @import") for f in found) and any(f.startswith("b.css: url()") for f in found)
    assert not any("arxiv" in f or "local" in f for f in found)


# About 15 s on 2 busy cores (under the 30 s that would make it `slow`).
def test_the_site_builds_strict_and_loads_nothing_from_outside(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    assert {"index.html", "reference/cli.html", "reference/config.html", "reference/api.html",
            "reference/hf.html", "changelog.html"} <= pages
    assert not any(p.startswith(("experiments/", "diagnoses/", "hooks/")) for p in pages)
    assert not (site / "experiments").exists() and not (site / "diagnoses").exists()
    assert external_fetches(site) == []
    # The API pages are rendered from docstrings (mkdocstrings), not left as `::: name` directives.
    api = (site / "reference" / "api.html").read_text(encoding="utf-8")
    assert "posbias.train" in api and ":::" not in api and "Returns" in api
