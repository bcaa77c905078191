"""EM/F1 by gold answer length (MaP Fig. 6): bucket labels, the shortest-gold rule, v2 no-answer,
the `by_answer_length` breakdown by hand, and that buckets average back to the overall scores."""
import random

import pytest

from posbias.errors import ConfigError
from posbias.experiment import load_experiment
from posbias.qa.answer_length import NO_ANSWER, answer_length_labels, bucket_label, check_edges, length_label
from posbias.qa.evaluate import score_predictions
from posbias.qa.examples import Answer, QAExample
from posbias.registry import SEGMENTERS


def ex(qid: str, *golds: str, **kw) -> QAExample:
    context = " ".join(golds) or "nothing here"
    answers = [Answer(g, context.index(g)) for g in golds]
    return QAExample(id=qid, question="?", context=context, answers=answers, is_impossible=not golds, **kw)


def test_default_buckets_and_their_order():
    got = [bucket_label(n) for n in range(1, 14)]
    assert got == ["01", "02", "03", "04-05", "04-05", "06-10", "06-10", "06-10", "06-10", "06-10",
                   "11+", "11+", "11+"]
    labels = list(dict.fromkeys(got)) + [NO_ANSWER]
    assert sorted(labels) == labels  # plain string order = length order, "no answer" last


def test_custom_edges():
    assert [bucket_label(n, (1, 3)) for n in (1, 2, 3, 9)] == ["1-2", "1-2", "3+", "3+"]
    assert [bucket_label(n, (1, 2, 100)) for n in (1, 5, 99, 100)] == ["001", "002-099", "002-099", "100+"]


@pytest.mark.parametrize("edges", [[], [0, 2], [2, 4], [1, 3, 3], [1, 1.5], [1, True], "1,2", None])
def test_bad_edges_are_refused(edges):
    with pytest.raises(ConfigError, match="edges must be a strictly increasing list"):
        check_edges(edges)


def test_shortest_gold_answer_decides():
    # Annotators differ by extra words around the same core: the shortest (in words) is used.
    assert length_label(["in the 1990s", "1990s", "the 1990s"]) == "01"
    assert length_label(["Denver Broncos", "the Denver Broncos"]) == "02"
    assert length_label(["a b c d e f g h i j k l"]) == "11+"
    assert length_label(["  ", "two words"]) == "02"  # a text without words is no length


def test_labels_of_examples_and_no_answer():
    mrqa = QAExample(id="m", question="?", context="x y z", answers=[Answer("x y z", 0)],
                     score_texts=["x y z", "z"])  # the texts the metric scores against decide
    labels = answer_length_labels([ex("a", "Santa Clara California"), ex("v2"), mrqa])
    assert labels == {"a": "03", "v2": NO_ANSWER, "m": "01"}


def test_registered_as_a_gold_only_segmenter():
    seg = SEGMENTERS.get("answer_length")
    assert seg.gold_only
    examples = [ex("a", "one two three four"), ex("b", "x")]
    assert seg(examples, None, None) == {"a": "04-05", "b": "01"}
    assert seg(examples, None, None, edges=[1, 3]) == {"a": "3+", "b": "1-2"}


@pytest.mark.parametrize("entry, message", [
    ({"name": "answer_length", "edges": [2, 4]}, r"segments\[0\]\.edges must be"),
    ({"name": "answer_length", "edge": [1, 2]}, r"segments\[0\]\.edge: unknown option"),
])
def test_bad_options_are_refused_when_the_spec_loads(tmp_path, entry, message):
    spec = {"name": "x", "base": "tiny", "methods": {"m": {}}, "seeds": [1], "segments": [entry],
            "output_dir": str(tmp_path)}
    with pytest.raises(ConfigError, match=message):
        load_experiment(spec)


def test_spec_with_edges_loads(tmp_path):
    spec = {"name": "x", "base": "tiny", "methods": {"m": {}}, "seeds": [1], "output_dir": str(tmp_path),
            "segments": ["answer_length", {"name": "answer_length", "edges": [1, 3, 6]}]}
    exp = load_experiment(spec)
    assert [s[0] for s in exp.segments] == ["answer_length", "answer_length(edges=[1, 3, 6])"]


def test_breakdown_by_hand_v1():
    examples = [ex("q1", "Paris"), ex("q2", "Denver Broncos", "the Denver Broncos"),
                ex("q3", "Santa Clara California"), ex("q4", "Levi's Stadium in the San Francisco Bay Area"),
                ex("q5", "one")]
    preds = {"q1": "Paris",          # EM 1, F1 1
             "q2": "Broncos",        # EM 0, F1: precision 1, recall 1/2 -> 2/3 (both golds)
             "q3": "Santa Clara",    # EM 0, F1: precision 1, recall 2/3 -> 4/5
             "q5": "two"}            # EM 0, F1 0; q4 (8 words) has no prediction: 0, 0
    res = score_predictions(examples, preds, {}, version=1)
    by = res["by_answer_length"]
    assert list(by) == ["01", "02", "03", "06-10"]  # only non-empty buckets, in length order
    assert by["01"] == {"total": 2, "exact_match": 50.0, "f1": 50.0}
    assert by["02"] == {"total": 1, "exact_match": 0.0, "f1": pytest.approx(200 / 3)}
    assert by["03"] == {"total": 1, "exact_match": 0.0, "f1": pytest.approx(80.0)}
    assert by["06-10"] == {"total": 1, "exact_match": 0.0, "f1": 0.0}
    assert res["exact_match"] == 20.0 and res["f1"] == pytest.approx((1 + 2 / 3 + 0.8) / 5 * 100)
    assert_buckets_average_to_overall(res, "exact_match")


def test_breakdown_v2_follows_the_no_answer_threshold():
    examples = [ex("a", "Paris"), ex("b", "Paris"), ex("c"), ex("d"), ex("e", "New York City")]
    preds = {"a": "Paris", "b": "Paris", "c": "", "d": "London", "e": "York"}
    # b's no-answer odds pass the threshold (1.0): scored as "" although its text is right.
    null_odds = {"a": 0.1, "b": 2.0, "c": 3.0, "d": 0.2, "e": 0.5}
    res = score_predictions(examples, preds, null_odds, version=2)
    by = res["by_answer_length"]
    assert list(by) == ["01", "03", NO_ANSWER]
    assert by["01"] == {"total": 2, "exact": 50.0, "f1": 50.0}
    assert by[NO_ANSWER] == {"total": 2, "exact": 50.0, "f1": 50.0}  # c abstains (right), d answers (wrong)
    assert by["03"]["exact"] == 0.0 and by["03"]["f1"] == pytest.approx(50.0)  # 1 of 3 tokens: 2 * 1 * 1/3 / (4/3)
    assert_buckets_average_to_overall(res, "exact")


def test_buckets_average_to_overall_on_real_questions(dev_examples):
    rng = random.Random(0)
    preds = {}
    for e in dev_examples:  # a mix of exact, partial and wrong answers
        words = e.context.split()
        i = rng.randrange(len(words))
        preds[e.id] = rng.choice([e.answers[0].text, " ".join(e.answers[0].text.split()[:1]),
                                  " ".join(words[i:i + rng.randint(1, 6)])])
    res = score_predictions(dev_examples, preds, {}, version=1)
    assert len(res["by_answer_length"]) >= 4
    assert_buckets_average_to_overall(res, "exact_match")


def assert_buckets_average_to_overall(res: dict, em_key: str) -> None:
    by = res["by_answer_length"].values()
    total = sum(b["total"] for b in by)
    assert total == res["total"]
    for key in (em_key, "f1"):  # percentages in [0, 100]: a relative tolerance is portable
        assert sum(b["total"] * b[key] for b in by) / total == pytest.approx(res[key], rel=1e-12, abs=1e-9)
