"""EM/F1 by gold answer sentence (Ko et al. 2020): labels of hand-made paragraphs, `by_answer_sentence`
buckets that average back to the overall scores, the `answer_sentence` segmenter and its option, and
the metrics.json / `diagnose qa` files of a tiny model (the sentence table, the bias block first)."""
import json
import random

import pytest

from posbias.errors import ConfigError
from posbias.experiment import load_experiment
from posbias.qa.answer_sentence import NO_ANSWER, answer_sentence_labels, check_last
from posbias.qa.evaluate import score_predictions
from posbias.qa.examples import Answer, QAExample
from posbias.registry import SEGMENTERS

from helpers import DEMO_DEV, tiny_config

PARAGRAPH = ("Paris is in France. Dr. Smith lives in Berlin, in Germany. Rome is in Italy! Is Madrid in Spain? "
             "Lisbon is in Portugal. Vienna is in Austria.")


def ex(qid: str, *golds: str, context: str = PARAGRAPH) -> QAExample:
    answers = [Answer(g, context.index(g)) for g in golds]
    return QAExample(id=qid, question="?", context=context, answers=answers, is_impossible=not golds)


def test_labels_of_a_hand_made_paragraph():
    examples = [ex("paris", "Paris"), ex("smith", "Smith"), ex("berlin", "Berlin"), ex("rome", "Rome"),
                ex("madrid", "Madrid"), ex("lisbon", "Lisbon"), ex("vienna", "Vienna"), ex("none")]
    # "Dr." is an abbreviation, not a sentence end: Smith and Berlin are both in sentence 2.
    assert answer_sentence_labels(examples) == {"paris": "1", "smith": "2", "berlin": "2", "rome": "3",
                                                "madrid": "4", "lisbon": "5+", "vienna": "5+", "none": NO_ANSWER}
    assert answer_sentence_labels(examples, last=3)["madrid"] == "3+"
    # The first gold answer decides, not the earliest one in the text.
    assert answer_sentence_labels([ex("q", "Rome", "Paris")]) == {"q": "3"}
    # A one-sentence paragraph: everything in sentence 1.
    assert answer_sentence_labels([ex("one", "here", context="the answer is here")]) == {"one": "1"}


def test_buckets_sum_back_to_overall_v1():
    examples = [ex("a", "Paris"), ex("b", "Berlin"), ex("c", "Rome"), ex("d", "Madrid"), ex("e", "Lisbon"),
                ex("f", "Vienna"), ex("g", "France")]
    preds = {"a": "Paris", "b": "in Berlin", "c": "Italy", "d": "Madrid", "e": "Lisbon is", "g": "France"}
    res = score_predictions(examples, preds, {}, version=1)  # f has no prediction: 0, 0
    by = res["by_answer_sentence"]
    assert list(by) == ["1", "2", "3", "4", "5+"]
    assert by["1"] == {"total": 2, "exact_match": 100.0, "f1": 100.0}
    assert by["2"] == {"total": 1, "exact_match": 0.0, "f1": pytest.approx(200 / 3)}  # P 1/2, R 1
    assert by["3"] == {"total": 1, "exact_match": 0.0, "f1": 0.0}
    assert by["4"] == {"total": 1, "exact_match": 100.0, "f1": 100.0}
    assert by["5+"] == {"total": 2, "exact_match": 0.0, "f1": pytest.approx(100 / 3)}  # 2/3 and 0
    assert_buckets_sum_to_overall(res, "exact_match")


def test_buckets_sum_back_to_overall_v2():
    examples = [ex("a", "Paris"), ex("b", "Rome"), ex("c"), ex("d"), ex("e", "Vienna")]
    preds = {"a": "Paris", "b": "Rome", "c": "", "d": "London", "e": "Austria"}
    null_odds = {"a": 0.1, "b": 2.0, "c": 3.0, "d": 0.2, "e": 0.5}  # b abstains (over the threshold 1.0)
    res = score_predictions(examples, preds, null_odds, version=2)
    by = res["by_answer_sentence"]
    assert list(by) == ["1", "3", "5+", NO_ANSWER]
    assert by["3"] == {"total": 1, "exact": 0.0, "f1": 0.0} and by[NO_ANSWER]["exact"] == 50.0
    assert_buckets_sum_to_overall(res, "exact")


def test_buckets_sum_back_to_overall_on_real_questions(dev_examples):
    rng = random.Random(0)
    preds = {}
    for e in dev_examples:  # a mix of exact, partial and wrong answers
        words = e.context.split()
        i = rng.randrange(len(words))
        preds[e.id] = rng.choice([e.answers[0].text, " ".join(e.answers[0].text.split()[:1]),
                                  " ".join(words[i:i + rng.randint(1, 6)])])
    res = score_predictions(dev_examples, preds, {}, version=1)
    assert list(res["by_answer_sentence"]) == ["1", "2", "3", "4", "5+"]
    assert_buckets_sum_to_overall(res, "exact_match")


def assert_buckets_sum_to_overall(res: dict, em_key: str) -> None:
    by = res["by_answer_sentence"].values()
    total = sum(b["total"] for b in by)
    assert total == res["total"]
    for key in (em_key, "f1"):  # percentages in [0, 100]: a relative tolerance is portable
        assert sum(b["total"] * b[key] for b in by) / total == pytest.approx(res[key], rel=1e-12, abs=1e-9)


def test_registered_as_a_gold_only_segmenter():
    seg = SEGMENTERS.get("answer_sentence")
    assert seg.gold_only
    examples = [ex("a", "Paris"), ex("b", "Madrid")]
    assert seg(examples, None, None) == {"a": "1", "b": "4"}
    assert seg(examples, None, None, last=2) == {"a": "1", "b": "2+"}


@pytest.mark.parametrize("last", [1, 10, 0, 2.5, True, "5", None])
def test_bad_last_is_refused(last):
    with pytest.raises(ConfigError, match="last must be an integer in 2..9"):
        check_last(last)


@pytest.mark.parametrize("entry, message", [
    ({"name": "answer_sentence", "last": 1}, r"segments\[0\]\.last must be an integer"),
    ({"name": "answer_sentence", "lats": 4}, r"segments\[0\]\.lats: unknown option of answer_sentence"),
])
def test_bad_options_are_refused_when_the_spec_loads(tmp_path, entry, message):
    spec = {"name": "x", "base": "tiny", "methods": {"m": {}}, "seeds": [1], "segments": [entry],
            "output_dir": str(tmp_path)}
    with pytest.raises(ConfigError, match=message):
        load_experiment(spec)


def test_spec_with_last_loads(tmp_path):
    spec = {"name": "x", "base": "tiny", "methods": {"m": {}}, "seeds": [1], "output_dir": str(tmp_path),
            "segments": ["answer_sentence", {"name": "answer_sentence", "last": 3}]}
    assert [s[0] for s in load_experiment(spec).segments] == ["answer_sentence", "answer_sentence(last=3)"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    import posbias
    from posbias.config import build_config

    tmp = tmp_path_factory.mktemp("sentence_run")
    posbias.train(build_config(tiny_config(tmp, train={"max_steps": 1})), progress=False)
    return tmp / "run"


def test_metrics_json_has_the_sentence_buckets(tiny_run):
    metrics = json.loads((tiny_run / "eval" / "metrics.json").read_text(encoding="utf-8"))
    by = metrics["by_answer_sentence"]
    assert set(by) <= {"1", "2", "3", "4", "5+"} and sum(b["total"] for b in by.values()) == metrics["total"] == 24
    assert sum(b["total"] * b["f1"] for b in by.values()) / 24 == pytest.approx(metrics["f1"], rel=1e-12, abs=1e-9)


def test_diagnose_writes_the_sentence_table_and_the_verdict_first(tiny_run, tmp_path):
    from posbias.qa.diagnose import diagnose

    res = diagnose(tiny_run / "best", DEMO_DEV, tmp_path / "diag", xs=(40,), overrides=["data.max_eval_examples=40"],
                   progress=False, bias_samples=300, min_bucket=8)
    rows = res["tables"]["answer_sentence"]
    assert [r["segment"] for r in rows] == ["1", "2", "3", "4", "5+"] and sum(r["questions"] for r in rows) == 40
    bias = res["position_bias"]
    assert list(bias["axes"]) == ["gold_position_quartile", "answer_sentence"]
    sentence = bias["axes"]["answer_sentence"]
    sentence_f1 = {r["segment"]: r["f1"] for r in rows}
    assert {b["label"]: b["score"] for b in sentence["buckets"]} == pytest.approx(sentence_f1, rel=1e-12, abs=1e-9)
    for v in bias["axes"].values():  # every group that sets a number holds >= min_bucket questions
        assert v["samples"] == 300 and all(g["n"] >= 8 for g in v["groups"] if g["sized"])
        if v["front"] is not None:
            assert v["effect"] == pytest.approx(v["front"]["score"] - v["rear"]["score"])
            assert v["ci"][0] <= v["ci"][1]
    assert bias["quality"]["below"]  # a 1-step model: F1 under the floor, said
    out = tmp_path / "diag"
    md = (out / "diagnosis.md").read_text(encoding="utf-8")
    headings = [line for line in md.splitlines() if line.startswith("#")]
    assert headings[1] == "## Position bias"  # right after the title
    assert md.splitlines()[4] == f"**{bias['sentence']}**"  # then the verdict sentence
    assert "below the quality floor of 20" in md
    assert any(h.startswith("### EM/F1 by the paragraph sentence") for h in headings)
    assert "| answer sentence |" in md and "| answer position |" in md
    page = (out / "diagnosis.html").read_text(encoding="utf-8")
    assert page.index("<h2>Position bias</h2>") < page.index("<table") < page.index("questions, ")
    assert page.count("<table") == len(res["tables"]) + 1  # the verdict block, then one per table
    saved = json.loads((out / "diagnosis.json").read_text(encoding="utf-8"))
    assert list(saved)[0] == "position_bias" and "by_answer_sentence" in saved["metrics"]
    assert saved["verdict_lines"] == res["verdict_lines"]
    assert "by_answer_sentence" in json.loads((out / "eval" / "metrics.json").read_text(encoding="utf-8"))


def test_diagnose_cli_prints_the_verdict_not_the_report(tiny_run, tmp_path, capsys):
    from posbias.cli import main

    def run(out, samples, *extra):
        return main(["-q", "diagnose", "qa", "--model", str(tiny_run / "best"), "--data", str(DEMO_DEV),
                     "--output-dir", str(tmp_path / out), "--bootstrap-samples", samples, *extra,
                     "data.max_eval_examples=12"])

    assert run("d0", "0", "--min-bucket", "4") == 0
    printed = capsys.readouterr().out
    bias = json.loads((tmp_path / "d0" / "diagnosis.json").read_text(encoding="utf-8"))["position_bias"]
    assert bias["samples"] == 0 and bias["min_size"] == 4
    for v in bias["axes"].values():
        assert v["ci"] is None and v["psi_ci"] is None and (v["trend"] is None or v["trend"]["ci"] is None)
    assert printed.splitlines()[0].startswith("Position bias of ") and "12 questions" in printed
    assert bias["sentence"] in printed and f"report: {tmp_path / 'd0'}/diagnosis.md" in printed
    assert "## Position bias" not in printed and len(printed.splitlines()) < 15  # not the whole markdown
    assert run("d1", "0", "--verbose") == 0
    verbose = capsys.readouterr().out
    assert "## Position bias" in verbose and "### F1 by quarter" in verbose and "report: " in verbose
    for bad, message in ((("-1",), "argument --bootstrap-samples: must be an integer in [0, 1000000]"),
                         (("10", "--min-bucket", "0"), "argument --min-bucket: must be an integer >= 1")):
        with pytest.raises(SystemExit) as exit_:  # refused while parsing the arguments
            run("bad", *bad)
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
