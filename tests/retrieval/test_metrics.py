"""posbias/retrieval/metrics.py: the gold passage's rank (ties at their expected rank) and the
metrics of one relevant passage, against hand-computed values."""
import math

import numpy as np
import pytest

from posbias.retrieval.metrics import (
    gold_ranks,
    ndcg_at,
    per_query,
    recall_at,
    reciprocal_rank,
)


def test_gold_ranks_count_the_passages_above_and_half_the_ties():
    scores = np.array([[0.9, 0.1, 0.5, 0.3],    # gold 0: first
                       [0.9, 0.1, 0.5, 0.3],    # gold 1: last
                       [0.2, 0.7, 0.7, 0.7],    # gold 2: tied with two others: 1 + (2 / 2)
                       [0.4, 0.4, 0.4, 0.4]])   # all tied: the middle, 1 + 3 / 2
    assert gold_ranks(scores, np.array([0, 1, 2, 3])).tolist() == [1.0, 4.0, 2.0, 2.5]
    with pytest.raises(ValueError, match="gold_ranks"):
        gold_ranks(scores[0], np.array([0]))


def test_metrics_of_one_relevant_passage():
    ranks = np.array([1.0, 2.0, 3.0, 10.0, 11.0, 2.5])
    assert ndcg_at(ranks, 10).tolist() == pytest.approx(
        [1.0, 1 / math.log2(3), 0.5, 1 / math.log2(11), 0.0, 1 / math.log2(3.5)])
    assert recall_at(ranks, 1).tolist() == [1, 0, 0, 0, 0, 0]
    assert recall_at(ranks, 10).tolist() == [1, 1, 1, 1, 0, 1]
    assert reciprocal_rank(ranks).tolist() == pytest.approx([1, 0.5, 1 / 3, 0.1, 1 / 11, 0.4])
    points = per_query(ranks)
    assert set(points) == {"NDCG@10", "recall@1", "recall@10", "MRR"}
    assert points["MRR"][1] == pytest.approx(50.0) and points["recall@10"][4] == 0.0
