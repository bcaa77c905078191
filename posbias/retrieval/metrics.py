"""Ranking metrics of one relevant passage per query, from the gold passage's rank.

With a single relevant passage, NDCG@k = 1 / log2(1 + rank) when rank <= k (the ideal DCG is 1),
recall@k = [rank <= k] and MRR = 1 / rank. The rank counts the passages scored above the gold one;
passages tied with it count half (the expected rank when ties are broken at random), so a scorer
that gives every passage the same score ranks the gold passage in the middle, not first.

Shape legend: q queries, p passages.
"""
from __future__ import annotations

import numpy as np


def gold_ranks(scores: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """1-based rank of each query's gold passage (q,), float: ties at their expected rank.

    Args:
        scores: (q, p) query-passage scores, higher is better.
        gold: (q,) index of each query's gold passage.
    """
    scores = np.asarray(scores)
    gold = np.asarray(gold, dtype=np.int64)
    if scores.ndim != 2 or gold.shape != (scores.shape[0],):
        raise ValueError(f"gold_ranks: scores (q, p) and gold (q,) expected, got {scores.shape} and {gold.shape}")
    if np.isnan(scores).any():  # NaN compares false: a gold passage of NaN would rank 0.5, NDCG@10 171
        raise ValueError("gold_ranks: the scores hold NaN")
    own = scores[np.arange(len(gold)), gold][:, None]  # (q, 1)
    above = (scores > own).sum(axis=1)
    tied = (scores == own).sum(axis=1) - 1  # the gold passage itself is not a tie
    return 1.0 + above + tied / 2.0


def ndcg_at(ranks: np.ndarray, k: int = 10) -> np.ndarray:
    """Per-query NDCG@k with one relevant passage (q,)."""
    ranks = np.asarray(ranks, dtype=np.float64)
    return np.where(ranks <= k, 1.0 / np.log2(1.0 + ranks), 0.0)


def recall_at(ranks: np.ndarray, k: int) -> np.ndarray:
    """Per-query recall@k with one relevant passage: 1 when it ranks in the top k (q,)."""
    return (np.asarray(ranks, dtype=np.float64) <= k).astype(np.float64)


def reciprocal_rank(ranks: np.ndarray) -> np.ndarray:
    """Per-query 1 / rank (q,); its mean is MRR."""
    return 1.0 / np.asarray(ranks, dtype=np.float64)


METRICS = {"NDCG@10": lambda r: ndcg_at(r, 10), "recall@1": lambda r: recall_at(r, 1),
           "recall@10": lambda r: recall_at(r, 10), "MRR": reciprocal_rank}
"""The per-query metrics a diagnosis reports, by name (values in 0..1)."""


def per_query(ranks: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric of `METRICS` per query, in points (0..100); a value outside that range (a rank
    below 1 or NaN) raises instead of reaching a report."""
    out = {name: 100.0 * fn(ranks) for name, fn in METRICS.items()}
    for name, v in out.items():
        bad = ~((v >= 0.0) & (v <= 100.0))  # NaN fails both comparisons
        if bad.any():
            raise ValueError(f"per_query: {name} {v[bad][0]} is outside 0..100 points (gold rank "
                             f"{np.asarray(ranks, dtype=np.float64)[bad][0]}; a rank is >= 1)")
    return out
