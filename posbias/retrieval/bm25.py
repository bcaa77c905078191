"""BM25, the lexical baseline of `posbias diagnose retrieval`, through the `bm25s` library.

Why bm25s (0.3.16) and not rank-bm25 (0.2.2): on SQuAD v1.1 dev (2,067 passages x 10,570 questions,
1 thread, AMD EPYC) the full score matrix takes 0.14 s to index + 0.45 s to score with bm25s against
0.07 s + 43 s with rank-bm25 (a Python loop over every passage for every query term), with the same
gold ranks for every question; bm25s also has Lucene's idf, which rank-bm25 lacks (its BM25Okapi uses
ln((N - df + 0.5) / (df + 0.5)), floored at 0.25 x the mean idf). bm25s's scores equal a float64
numpy implementation of the formula below to 1e-7 relative (float32).

The scores are Lucene's BM25 (bm25s `method="lucene"`, also its idf):

    score(q, d) = sum over the tokens t of q of  idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

N passages, df(t) the passages holding t, tf(t, d) its count in d, |d| the tokens of d, avgdl their
mean over the corpus. As in Lucene since 8.0, the textbook's constant factor (k1 + 1) is left out
(ranks are unchanged). A token repeated in the query counts once per occurrence; a passage sharing no
token with the query scores 0. Tokens (`tokenize`): lowercased runs of letters and digits (every
other character splits, `_` included), Lucene's 33 English stop words removed, no stemming.

Shape legend: q queries, p passages, b a block of queries.
"""
from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Iterator

import numpy as np

from ..diagnoses import STOP_WORDS, tokenize  # noqa: F401  (re-exported: bm25's tokens)
from ..errors import ConfigError

# The tokens BM25 matches are shared with the generation diagnosis (its relevance orders): `posbias.diagnoses`.
MISSING = ('diagnose retrieval: the BM25 baseline needs the bm25s package (the `retrieval` extra): '
           'pip install "posbias[retrieval]" (or pip install bm25s), or leave BM25 out with --no-bm25 '
           "(bm25=False in Python)")


def check_available() -> None:
    """Refuse in one line, before any model is loaded or text embedded, when bm25s is not installed
    (the `retrieval` extra). Looks the package up without importing it."""
    try:
        found = importlib.util.find_spec("bm25s") is not None
    except (ImportError, ValueError):  # a broken or half-removed installation
        found = False
    if not found:
        raise ConfigError(MISSING)


def _import_bm25s():
    try:
        import bm25s
    except ImportError as e:
        raise ConfigError(MISSING) from e
    return bm25s


def bm25_scores(passages: list[str], queries: list[str], *, k1: float = 1.5, b: float = 0.75,
                batch: int = 1024) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (first query index, float32 array (n_batch_queries, n_passages)) score blocks.

    The blocks cover the queries in order, `batch` queries each (the last one fewer). The index is
    built here, before the first block is asked for, so a missing bm25s raises `ConfigError` at the
    call.
    """
    if batch < 1:
        raise ValueError(f"bm25_scores: batch must be >= 1, got {batch}")
    if not passages:
        raise ValueError("bm25_scores: no passages to score")
    corpus = [tokenize(p) for p in passages]
    if not any(corpus):  # no token anywhere (bm25s cannot index an empty vocabulary): every score is 0
        return _blocks(None, [[] for _ in queries], len(passages), batch)
    bm25s = _import_bm25s()
    retriever = bm25s.BM25(k1=k1, b=b, method="lucene", dtype="float32")
    log = logging.getLogger("bm25s")  # bm25s sets its logger to DEBUG on import: keep index()'s debug line quiet
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        retriever.index(corpus, show_progress=False)
    finally:
        log.setLevel(level)
    ids = [retriever.get_tokens_ids(tokenize(q)) for q in queries]  # tokens the corpus lacks dropped
    return _blocks(retriever, ids, len(passages), batch)


def _blocks(retriever, ids: list[list[int]], n_passages: int, batch: int) -> Iterator[tuple[int, np.ndarray]]:
    for lo in range(0, len(ids), batch):
        block = np.zeros((len(ids[lo:lo + batch]), n_passages), dtype=np.float32)  # (b, p)
        for row, q in enumerate(ids[lo:lo + batch]):
            if q:  # a query with no corpus token scores 0 everywhere (get_scores fails on an empty one)
                block[row] = retriever.get_scores(q)
        yield lo, block
