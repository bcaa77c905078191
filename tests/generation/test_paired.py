"""posbias/generation/paired.py: the paired position verdict on hand-made score matrices."""
import numpy as np
import pytest

from posbias.generation.paired import paired_difference, position_verdict, sentence, u_text


def test_a_flat_curve_has_no_effect_and_psi_zero():
    v = position_verdict(np.full((40, 5), 60.0), samples=200)
    assert v["effect"] == 0 and v["ci"] == [0, 0] and v["psi"] == 0
    assert v["evidence"] == "no"
    assert [c["score"] for c in v["curve"]] == [60.0] * 5
    assert v["u_shape"]["effect"] == 0


def test_hand_computed_u_shape_edges_trend_and_psi():
    base = np.array([80.0, 50.0, 40.0, 50.0, 70.0])
    rng = np.random.default_rng(0)
    s = base + rng.normal(0, 1, size=(300, 5))
    v = position_verdict(s, samples=500)
    means = s.mean(axis=0)
    assert v["effect"] == pytest.approx(means[0] - means[-1])
    assert v["u_shape"]["edge"] == "first"
    assert v["u_shape"]["effect"] == pytest.approx(means[1:4].mean() - means[0])
    assert v["u_shape"]["ci"][1] < 0 and "lost in the middle" in u_text(v, "F1")
    x = np.arange(1, 6) - 3.0
    assert v["trend"]["slope"] == pytest.approx(float(np.mean((s - s.mean(1, keepdims=True)) @ x / (x @ x))))
    assert v["psi"] == pytest.approx(1 - means.min() / means.max())
    assert v["evidence"] == "yes" and v["ci"][0] > 0
    for c in v["curve"]:
        assert c["ci"][0] <= c["score"] <= c["ci"][1]


def test_the_last_position_scoring_higher_is_reversed():
    s = np.tile([40.0, 45.0, 60.0], (50, 1)) + np.random.default_rng(1).normal(0, 2, size=(50, 3))
    v = position_verdict(s, samples=300)
    assert v["evidence"] == "reversed" and v["effect"] < 0
    assert "higher" in sentence(v, "F1")


def test_pairing_removes_question_difficulty_from_the_interval():
    """Questions of very different difficulty, the same small drop at the last position: a paired
    interval sees it."""
    rng = np.random.default_rng(2)
    difficulty = rng.uniform(0, 100, size=(200, 1))
    s = difficulty + np.array([1.0, 0.0, 0.0, -1.0]) + rng.normal(0, 0.1, size=(200, 4))
    v = position_verdict(s, samples=500)
    assert v["ci"][0] > 1.5 and v["evidence"] == "yes"


def test_too_few_questions():
    v = position_verdict(np.ones((5, 3)), samples=50, min_size=30)
    assert v["evidence"] == "too few"
    assert "fewer than 30 questions" in sentence(v, "F1")


def test_paired_difference_of_a_shift_is_the_shift():
    s = np.random.default_rng(3).uniform(0, 100, size=(60, 4))
    d = paired_difference(s + 5.0, s, samples=200)
    assert d["effect"] == pytest.approx(5.0) and d["ci"] == pytest.approx([5.0, 5.0])
    assert [p["effect"] for p in d["by_position"]] == pytest.approx([5.0] * 4)
    assert d["middle"]["effect"] == pytest.approx(5.0)
    with pytest.raises(ValueError):
        paired_difference(np.ones((0, 3)), np.ones((0, 3)))
