"""The position-bias verdict (`posbias.analysis.verdict`): sized buckets, the signed front − rear effect
and its interval, the trend and its permutation test, the evidence word, the quality floor, the
tagging α axis from per-sentence counts, and the sentences a user reads."""
import math

import numpy as np
import pytest

from posbias.analysis import verdict as V


def _qa(positions, scores, window=384):
    """Question ids -> quarter labels, scores and positions, as `posbias diagnose qa` builds them."""
    from posbias.qa.positions import quartile_labels

    ids = [f"q{i}" for i in range(len(positions))]
    pos = dict(zip(ids, (int(p) for p in positions)))
    return quartile_labels(pos, window), dict(zip(ids, (float(s) for s in scores))), pos


# ------------------------------------------------------------------------------------------ buckets
def test_sized_groups_merge_small_buckets_forwards_and_a_small_tail_backwards():
    assert V.sized_groups([300, 97, 6], 30) == [[0], [1, 2]]
    assert V.sized_groups([10, 10, 10, 50, 5], 30) == [[0, 1, 2], [3, 4]]
    assert V.sized_groups([0, 40, 0, 40], 30) == [[1], [3]]  # empty buckets are no one's
    assert V.sized_groups([5, 5], 30) == [[0, 1]]  # one undersized group: nothing to compare
    assert V.sized_groups([], 30) == []


def test_group_labels_read_as_ranges():
    assert V.group_label(["Q2 [96,192)", "Q3 [192,288)"]) == "Q2–Q3 [96,288)"
    assert V.group_label(["3", "4", "5+"]) == "3–5+"
    assert V.group_label(["Q1 [0,96)"]) == "Q1 [0,96)"
    assert sorted(["5+", "10", "2", "1"], key=V.bucket_rank) == ["1", "2", "5+", "10"]


# ------------------------------------------------------------------------- the demo model's pitfall
def test_a_small_high_scoring_bucket_does_not_set_the_headline():
    # The demo model: Q3 holds 6 of 433 questions and scores 82.8, Q1 56.8 and Q2 55.6. Best minus
    # worst reported "26 points of position bias" from those 6 questions. Now Q3 is merged into Q2 and
    # the headline is front − rear of sized groups, with the direction kept.
    rng = np.random.default_rng(0)
    pos = np.r_[rng.integers(0, 96, 330), rng.integers(96, 192, 97), rng.integers(192, 288, 6)]
    f1 = np.r_[100.0 * (rng.random(330) < 0.568), 100.0 * (rng.random(97) < 0.556), [100.0] * 5 + [0.0]]
    labels, scores, positions = _qa(pos, f1)
    v = V.position_axis(labels, scores, positions=positions, per=100, unit="token", samples=1000)
    assert [g["label"] for g in v["groups"]] == ["Q1 [0,96)", "Q2–Q3 [96,288)"]
    assert v["rear"]["n"] == 103 and v["front"]["n"] == 330
    assert v["effect"] == pytest.approx(f1[:330].mean() - f1[330:].mean())
    assert abs(v["effect"]) < 10 and v["evidence"] == "no"
    assert all(g["n"] >= V.MIN_BUCKET for g in v["groups"])
    text = V.merged_text(v)
    assert "Q3 [192,288) (6) into Q2–Q3 [96,288)" in text
    # The unsigned best − worst of the raw buckets is the number this replaces.
    raw = [b["score"] for b in v["buckets"]]
    assert max(raw) - min(raw) > 20


def test_too_few_examples_to_tell():
    labels, scores, positions = _qa([10, 20, 200, 300], [100, 0, 50, 50])
    v = V.position_axis(labels, scores, positions=positions, samples=100)
    assert v["front"] is None and v["effect"] is None and v["evidence"] == "too few" and v["psi"] is None
    assert "Too few answers to tell: 4 in all" in V.sentence(v)
    one_place = V.position_axis(*_qa([5] * 80, [50.0] * 80)[:2], samples=100)  # every answer in one bucket
    assert one_place["evidence"] == "too few" and one_place["trend"] is None


# ----------------------------------------------------------------------- planted effects and nulls
def _planted(n, slope_per_token, seed):
    """Per-question F1 0/100 with P(correct) = 0.7 + slope x (position − 192): a planted effect."""
    rng = np.random.default_rng(seed)
    pos = rng.integers(0, 384, n)
    p = np.clip(0.7 + slope_per_token * (pos - 192), 0.02, 0.98)
    return _qa(pos, 100.0 * (rng.random(n) < p))


def test_a_planted_fall_with_position_is_found_with_its_sign():
    labels, scores, positions = _planted(600, -0.0012, seed=1)  # 46 points less at the end of the window
    v = V.position_axis(labels, scores, positions=positions, per=100, unit="token", samples=1000)
    assert v["evidence"] == "yes" and v["effect"] > 0 and v["ci"][0] > 0
    assert v["trend"]["slope"] < 0 and v["trend"]["ci"][1] < 0 and v["trend"]["p"] < 0.01
    assert V.sentence(v).startswith("Rear answers (Q4 [288,384), n=") and "F1 lower than front ones (Q1" in V.sentence(v)
    labels, scores, positions = _planted(600, +0.0012, seed=1)
    rising = V.position_axis(labels, scores, positions=positions, per=100, samples=1000)
    assert rising["evidence"] == "reversed" and rising["effect"] < 0 and rising["ci"][1] < 0
    assert "F1 higher than front ones" in V.sentence(rising)


def test_a_position_blind_model_is_reported_as_no_evidence_at_the_nominal_rate():
    # 60 models whose correctness does not depend on position: "yes" or "reversed" must be rare
    # (the interval is a 95% one; a test that called noise a bias would fire far more often).
    calls = []
    for s in range(60):
        labels, scores, positions = _planted(240, 0.0, seed=s)
        calls.append(V.position_axis(labels, scores, positions=positions, samples=400)["evidence"])
    assert calls.count("no") >= 52 and "too few" not in calls
    perms = [V.trend(*zip(*[(p, s) for p, s in zip(np.random.default_rng(s).integers(0, 384, 200),
                                                   np.random.default_rng(s + 99).random(200))]),
                     samples=300, seed=s)["p"] for s in range(40)]
    assert 0.2 < np.mean(perms) < 0.8 and sum(p < 0.05 for p in perms) <= 6  # p ~ uniform under the null


def test_the_interval_is_a_within_group_bootstrap_of_the_difference():
    rng = np.random.default_rng(5)
    front, rear = 100.0 * (rng.random(400) < 0.8), 100.0 * (rng.random(300) < 0.6)
    r = V.front_rear(front, rear, samples=4000, seed=0)
    se = math.sqrt(front.var() / len(front) + rear.var() / len(rear))
    assert r["ci"][1] - r["ci"][0] == pytest.approx(2 * 1.96 * se, rel=0.1)
    assert r["ci"][0] < r["effect"] < r["ci"][1]
    assert V.front_rear(front, rear, samples=0)["ci"] is None


def test_trend_is_the_least_squares_slope():
    x = np.arange(10.0)
    t = V.trend(x, 3 - 2 * x, per=100, samples=200)
    assert t["slope"] == pytest.approx(-200.0) and t["ci"] == pytest.approx([-200.0, -200.0])
    assert t["p"] == pytest.approx(1 / 201)  # no permutation reaches the exact line's slope
    assert V.trend([1, 1, 1], [0, 1, 2]) is None  # positions that do not vary: no slope


def test_evidence_words():
    assert V.evidence(5.0, [1.0, 9.0]) == "yes"
    assert V.evidence(-5.0, [-9.0, -1.0]) == "reversed"
    assert V.evidence(1.0, [-2.0, 4.0]) == "no"
    assert V.evidence(1.0, None) == "no"  # no interval: no evidence claimed
    assert V.evidence(3.0, [1.0, 5.0], enough=False) == "too few"


def test_quality_floor():
    assert V.quality(3.7)["below"] and not V.quality(56.8)["below"]
    assert "below the quality floor of 20" in V.quality_text(V.quality(3.7))
    assert V.quality_text(V.quality(56.8)) == ""
    assert not V.quality(float("nan"))["below"]


# ------------------------------------------------------------------------------------- tagging α
def _alpha_cells(k_max):
    return [(k, a) for k in range(1, k_max + 1) for a in range(1, k + 1)]


def _ner_counts(cells, n, p_by_alpha, seed):
    """(cells, n, 2) NER counts (2 TP, predicted + gold) of sentences with 2 gold entities each, each
    found with probability p_by_alpha(α), predicted entities = found ones."""
    rng = np.random.default_rng(seed)
    out = np.zeros((len(cells), n, 2))
    for c, (_, a) in enumerate(cells):
        tp = rng.binomial(2, p_by_alpha(a), size=n)
        out[c, :, 0], out[c, :, 1] = 2 * tp, tp + 2
    return out


def test_alpha_axis_reproduces_the_corpus_scores_and_finds_a_planted_fall():
    cells = _alpha_cells(5)
    counts = _ner_counts(cells, 300, lambda a: 0.9 - 0.08 * (a - 1), seed=0)
    v = V.alpha_axis(cells, counts, samples=500)
    # the point curve is each α's mean over k >= α of the cells' corpus F1 = sum 2TP / sum (P + G)
    for j, a in enumerate(v["alphas"]):
        cell_f1 = [100 * counts[c, :, 0].sum() / counts[c, :, 1].sum() for c, (_, ca) in enumerate(cells) if ca == a]
        assert v["curve"][j] == pytest.approx(np.mean(cell_f1), rel=1e-12)
        assert v["curve_ci"][j][0] <= v["curve"][j] <= v["curve_ci"][j][1]
    assert v["effect"] == pytest.approx(v["curve"][0] - v["curve"][-1])
    assert v["evidence"] == "yes" and v["ci"][0] > 0 and v["trend"]["slope"] < 0 and v["trend"]["ci"][1] < 0
    assert V.sentence(v, where="duplicate mode").startswith("Copy 5 scores ")


def test_alpha_axis_of_a_position_blind_tagger():
    # The same predictions at every copy (a model without positions): effect exactly 0, "no".
    cells = _alpha_cells(4)
    one = _ner_counts([(1, 1)], 200, lambda a: 0.7, seed=3)[0]
    v = V.alpha_axis(cells, np.broadcast_to(one, (len(cells), *one.shape)), samples=300)
    assert v["effect"] == 0 and v["ci"] == [0.0, 0.0] and v["evidence"] == "no"
    assert v["psi"] == pytest.approx(0, abs=1e-12)
    # and noisy but position-free predictions: no evidence on most draws
    calls = [V.alpha_axis(cells, _ner_counts(cells, 150, lambda a: 0.7, seed=s), samples=300)["evidence"]
             for s in range(30)]
    assert calls.count("no") >= 26


def test_alpha_axis_with_too_few_sentences():
    cells = _alpha_cells(3)
    v = V.alpha_axis(cells, _ner_counts(cells, 12, lambda a: 0.9 - 0.3 * (a - 1), seed=0), samples=200)
    assert v["evidence"] == "too few" and "fewer than 30 sentences" in V.sentence(v)
