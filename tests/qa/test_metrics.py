"""Hand-computed SQuAD EM/F1 cases, checked against the official scripts' definitions."""
import json

import pytest

from posbias.errors import DataError
from posbias.qa.metrics import (
    exact_match,
    f1,
    normalize_answer,
    per_question,
    score_files,
    squad_v1,
    squad_v2,
)


@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("  The Quick,  BROWN fox! ", "quick brown fox"),  # case, punctuation, article, spaces
        ("an apple a day", "apple day"),
        ("theatre and anthem", "theatre and anthem"),  # articles only as whole words
        ("the-cat", "thecat"),  # punctuation goes first, so "the" is no longer a word
        ("A", ""),
        ("New\tYork\n\nCity", "new york city"),
    ],
)
def test_normalize_answer(raw, normalized):
    assert normalize_answer(raw) == normalized


def _official_normalize(s: str) -> str:
    """normalize_answer of the official evaluate-v1.1.py / evaluate-v2.0.py, verbatim in substance."""
    import re
    import string

    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def test_normalize_answer_equals_the_official_on_every_punctuation_and_case():
    import random
    import string

    rng = random.Random(0)
    alphabet = string.printable + "İßÅéñ—–“”‘’…·«»\u00a0\u2009"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(2000)]
    texts += ["the" + p + "an" for p in string.punctuation]
    for t in texts:
        assert normalize_answer(t) == _official_normalize(t), repr(t)


def test_exact_match_uses_normalization():
    assert exact_match("The Eiffel Tower.", "eiffel tower") == 1.0
    assert exact_match("Eiffel Towers", "eiffel tower") == 0.0


def test_f1_partial_overlap():
    # pred "the cat sat on mat" -> [cat, sat, on, mat]; gold "a cat on the mat" -> [cat, on, mat].
    # common 3: P = 3/4, R = 3/3, F1 = 2 * 3/4 * 1 / (3/4 + 1) = 1.5 / 1.75 = 6/7.
    assert f1("the cat sat on mat", "a cat on the mat") == pytest.approx(6 / 7)
    assert exact_match("the cat sat on mat", "a cat on the mat") == 0.0


def test_f1_counts_repeated_tokens_once_per_match():
    # Counter overlap: pred [cat, cat, cat] vs gold [cat] share 1 token, not 3.
    # P = 1/3, R = 1, F1 = 2 * 1/3 / (4/3) = 1/2.
    assert f1("cat cat cat", "cat") == pytest.approx(0.5)


def test_f1_no_overlap_is_zero():
    assert f1("dog", "cat") == 0.0
    assert f1("dog", "cat", version="2.0") == 0.0


def test_empty_answers_v1_vs_v2():
    # v1.1 returns 0 whenever nothing overlaps, even when both sides are empty; EM is still 1.
    assert f1("", "", version="1.1") == 0.0
    assert exact_match("", "") == 1.0
    # v2.0: if either side has no tokens, F1 is 1 iff both are empty.
    assert f1("", "", version="2.0") == 1.0
    assert f1("The", "", version="2.0") == 1.0  # "the" normalizes to no tokens
    assert f1("cat", "", version="2.0") == 0.0
    assert f1("", "cat", version="2.0") == 0.0


def test_unknown_version_rejected():
    with pytest.raises(ValueError, match="version"):
        f1("a", "b", version="3.0")


def test_max_over_gold_answers():
    # pred [denver, broncos, team]:
    #   vs [broncos]: P = 1/3, R = 1 -> F1 = 1/2
    #   vs [denver, broncos, football, team]: P = 3/3, R = 3/4 -> F1 = 1.5 / 1.75 = 6/7
    gold = {"q": ["Broncos", "Denver Broncos football team"], "r": ["x", "Denver Broncos team."]}
    preds = {"q": "Denver Broncos team", "r": "denver broncos team"}
    scores = per_question(gold, preds)
    assert scores["q"][0] == 0.0
    assert scores["q"][1] == pytest.approx(6 / 7)
    assert scores["r"] == (1.0, 1.0)  # EM comes from the second gold answer


def test_squad_v1_missing_counts_zero_and_extra_ignored():
    gold = {"q1": ["Paris"], "q2": ["London"]}
    preds = {"q1": "paris", "zz": "London"}  # q2 missing; zz is not a gold id
    out = squad_v1(gold, preds)
    assert out == {"exact_match": 50.0, "f1": 50.0, "total": 2, "missing": 1, "extra": 1}
    assert per_question(gold, preds)["q2"] == (0.0, 0.0)


def test_squad_v1_rejects_unanswerable_question():
    with pytest.raises(ValueError, match="q1"):
        squad_v1({"q1": []}, {"q1": ""})


# Four questions, two answerable and two not:
#   q1 gold [Paris]          pred "Paris"  -> EM 1, F1 1
#   q2 gold [New York City]  pred "York"   -> EM 0, F1: P = 1, R = 1/3 -> 2 * 1/3 / (4/3) = 1/2
#   q3 unanswerable          pred ""       -> EM 1, F1 1
#   q4 unanswerable          pred "London" -> EM 0, F1 0
GOLD4 = {"q1": ["Paris"], "q2": ["New York City"], "q3": [], "q4": []}
PREDS4 = {"q1": "Paris", "q2": "York", "q3": "", "q4": "London"}


def test_squad_v2_has_ans_no_ans_breakdown():
    out = squad_v2(GOLD4, PREDS4)
    assert out == {
        "exact": 50.0,  # (1 + 0 + 1 + 0) / 4
        "f1": 62.5,  # (1 + 0.5 + 1 + 0) / 4
        "total": 4,
        "HasAns_exact": 50.0,  # (1 + 0) / 2
        "HasAns_f1": 75.0,  # (1 + 0.5) / 2
        "HasAns_total": 2,
        "NoAns_exact": 50.0,  # (1 + 0) / 2
        "NoAns_f1": 50.0,
        "NoAns_total": 2,
        "missing": 0,
        "extra": 0,
    }


def test_squad_v2_omits_empty_subset_and_drops_empty_gold_texts():
    # Gold ["The"] is a non-empty list (HasAns) but normalizes to "", so the official script
    # scores it like an unanswerable question: the empty prediction is right.
    out = squad_v2({"q": ["The"]}, {"q": ""})
    assert (out["exact"], out["f1"], out["HasAns_total"]) == (100.0, 100.0, 1)
    assert not any(k.startswith("NoAns") for k in out)


def test_squad_v2_na_prob_threshold():
    na = {"q1": 0.1, "q2": 0.9, "q3": 0.2, "q4": 0.8}
    # thresh 0.5: q2 and q4 abstain. q2 is answerable -> 0; q4 is unanswerable -> 1.
    # exact = f1 = (1 + 0 + 1 + 1) / 4 = 75.
    out = squad_v2(GOLD4, PREDS4, na, na_prob_thresh=0.5)
    assert (out["exact"], out["f1"]) == (75.0, 75.0)
    assert (out["HasAns_exact"], out["HasAns_f1"]) == (50.0, 50.0)
    assert (out["NoAns_exact"], out["NoAns_f1"]) == (100.0, 100.0)
    # thresh 0.8: abstain only when na_prob > 0.8, so q4 (0.8) keeps "London" -> 0.
    # exact = f1 = (1 + 0 + 1 + 0) / 4 = 50.
    out = squad_v2(GOLD4, PREDS4, na, na_prob_thresh=0.8)
    assert (out["exact"], out["f1"]) == (50.0, 50.0)
    # per_question applies the same rule for later per-question analyses.
    assert per_question(GOLD4, PREDS4, "2.0", na, 0.5)["q2"] == (0.0, 0.0)
    assert per_question(GOLD4, PREDS4, "2.0")["q2"] == (0.0, 0.5)


def test_squad_v2_best_thresholds():
    na = {"q1": 0.4, "q2": 0.3, "q3": 0.2, "q4": 0.1}
    # Start: all abstain -> 2 (q3, q4 right). Walk by na_prob: q4, q3, q2, q1.
    # exact: q4 "London" on unanswerable -1 -> 1; q3 "" -> 1; q2 +0 -> 1; q1 +1 -> 2.
    #        never strictly above 2 -> best 2/4 = 50 at the initial threshold 0.0.
    # f1:    q4 -> 1; q3 -> 1; q2 +0.5 -> 1.5; q1 +1 -> 2.5 > 2 -> best 2.5/4 = 62.5 at 0.4.
    out = squad_v2(GOLD4, PREDS4, na)
    assert (out["best_exact"], out["best_exact_thresh"]) == (50.0, 0.0)
    assert (out["best_f1"], out["best_f1_thresh"]) == (62.5, 0.4)
    assert "best_f1" not in squad_v2(GOLD4, PREDS4)


def test_best_thresh_tests_raw_prediction_string():
    # Official quirk: "The" normalizes to "" (EM 1 on the unanswerable q), but the walk tests the
    # raw string, so letting it through costs 1. Start 1 (a); a: -1 -> 0; b: +1 -> 1, not > 1.
    # best_exact = 1/2 = 50 at 0.0, below the plain exact of 100.
    out = squad_v2({"a": [], "b": ["x"]}, {"a": "The", "b": "x"}, {"a": 0.5, "b": 0.6})
    assert out["exact"] == 100.0
    assert (out["best_exact"], out["best_exact_thresh"]) == (50.0, 0.0)


def test_best_thresh_ties_walk_in_na_probs_order():
    # Equal na_probs keep the mapping's order (the official stable sort).
    # h first: start 1 (n); h +1 -> 2 > 1 at 0.5; n -1 -> 1.  best 2/2 = 100.
    # n first: n -1 -> 0; h +1 -> 1, not > 1.                   best 1/2 = 50 at 0.0.
    gold, preds = {"h": ["cat"], "n": []}, {"h": "cat", "n": "dog"}
    assert squad_v2(gold, preds, {"h": 0.5, "n": 0.5})["best_exact"] == 100.0
    assert squad_v2(gold, preds, {"n": 0.5, "h": 0.5})["best_exact"] == 50.0


def test_squad_v2_missing_prediction_counts_zero():
    # q2 is unanswerable and has no prediction: 0, not 1, and still in the denominator.
    # Walk: start 0 (no answered unanswerable q); q1 +1 -> 1 at na 0.0 -> best 1/2 = 50.
    out = squad_v2({"q1": ["x"], "q2": []}, {"q1": "x"}, {"q1": 0.0})
    assert (out["exact"], out["total"], out["missing"]) == (50.0, 2, 1)
    assert (out["HasAns_exact"], out["NoAns_exact"]) == (100.0, 0.0)
    assert out["best_exact"] == 50.0


def test_squad_v2_requires_na_prob_for_every_prediction():
    with pytest.raises(ValueError, match="q2"):
        squad_v2(GOLD4, PREDS4, {"q1": 0.1, "q3": 0.2, "q4": 0.3})


def _write_squad(path, version, qas):
    context = "Denver Broncos won Super Bowl 50 at Levi's Stadium in Santa Clara, California."
    for qa in qas:
        for a in qa["answers"]:
            a["answer_start"] = context.index(a["text"])
    data = {"version": version, "data": [{"title": "SB50", "paragraphs": [
        {"context": context, "qas": qas}]}]}
    path.write_text(json.dumps(data))
    return path


def test_score_files_v1(tmp_path):
    data = _write_squad(tmp_path / "dev.json", "1.1", [
        {"id": "q1", "question": "Who won?", "answers": [{"text": "Denver Broncos"}]},
        {"id": "q2", "question": "Where?", "answers": [{"text": "Santa Clara, California"}]},
    ])
    preds = tmp_path / "preds.json"
    # q1 exact; q2 [santa, clara] vs [santa, clara, california]: P = 1, R = 2/3 -> F1 = 4/5.
    preds.write_text(json.dumps({"q1": "the Denver Broncos", "q2": "Santa Clara"}))
    out = score_files(data, preds)
    assert out["exact_match"] == 50.0
    assert out["f1"] == pytest.approx(100 * (1 + 0.8) / 2)
    assert (out["total"], out["missing"], out["extra"]) == (2, 0, 0)
    with pytest.raises(ValueError, match="v2.0"):
        score_files(data, preds, na_prob_path=preds)


def test_score_files_auto_detects_v2(tmp_path):
    data = _write_squad(tmp_path / "dev.json", "v2.0", [
        {"id": "q1", "question": "Who won?", "answers": [{"text": "Denver Broncos"}],
         "is_impossible": False},
        {"id": "q2", "question": "Who lost?", "answers": [], "is_impossible": True},
    ])
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps({"q1": "Denver Broncos", "q2": "Santa Clara"}))
    na = tmp_path / "na.json"
    na.write_text(json.dumps({"q1": 0.2, "q2": 0.7}))
    out = score_files(data, preds, na, na_prob_thresh=0.5)
    # q2 abstains (0.7 > 0.5) and is unanswerable -> 1; q1 exact -> 1.
    assert (out["exact"], out["HasAns_total"], out["NoAns_total"]) == (100.0, 1, 1)
    assert "best_f1" in out


@pytest.mark.parametrize(
    "content, record",
    [('["q1", "Denver Broncos"]', None), ('{"q1": 3}', "q1"), ("{not json", None)],
)
def test_score_files_rejects_bad_predictions(tmp_path, content, record):
    data = _write_squad(tmp_path / "dev.json", "1.1", [
        {"id": "q1", "question": "Who won?", "answers": [{"text": "Denver Broncos"}]},
    ])
    preds = tmp_path / "preds.json"
    preds.write_text(content)
    with pytest.raises(DataError) as err:
        score_files(data, preds)
    assert err.value.path == str(preds)
    assert err.value.record == record
