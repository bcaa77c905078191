"""Tests of the documentation site: its generated reference is complete, the code it is generated
from is documented, the site builds offline, and the user pages carry no history."""
from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@cache
def generator():
    """docs/hooks/generate.py, the MkDocs hook that generates the reference pages."""
    spec = importlib.util.spec_from_file_location("posbias_docs_generate", ROOT / "docs" / "hooks" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
