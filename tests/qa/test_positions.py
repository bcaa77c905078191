"""Position analyses: gold/predicted positions, quartiles, S_X segments, update counts, §6.2, diagnose."""
import json

import numpy as np
import pytest
import torch

import posbias
from posbias.analysis.updates import PositionUpdateCounter
from posbias.qa.examples import Answer, QAExample
from posbias.qa.positions import (first_x_labels, gold_mention_positions, improvement_categories,
                                  predicted_start_positions, quartile_labels)
from posbias.config import build_config
from posbias.qa.collate import collate
from posbias.qa.features import build_qa_features

from helpers import DEMO_DEV, tiny_config, tiny_model


def test_gold_mention_positions_point_at_the_answers(tokenizer, dev_examples):
    examples = dev_examples[:40]
    mentions = gold_mention_positions(examples, tokenizer, max_seq_len=96, stride=32, max_query_len=24)
    feats = build_qa_features(examples, tokenizer, max_seq_len=96, stride=32, max_query_len=24)
    first_window = {}
    for w, e in enumerate(feats.example_index):
        first_window.setdefault(int(e), w)
    n_found = 0
    for i, e in enumerate(examples):
        assert len(mentions[e.id]) <= len(e.answers)
        n_found += len(mentions[e.id])
        for p in mentions[e.id]:
            assert p > 0  # never [CLS]
    assert n_found >= 40
    # The first answer of the first question: its token's characters start the answer text.
    w = first_window[0]
    p = mentions[examples[0].id][0]
    o = feats.offsets[w][p]
    assert examples[0].answers[0].text.lower().startswith(examples[0].context[o[0]:o[1]].lower())


def test_quartiles_and_first_x_by_hand():
    labels = quartile_labels({"a": 0, "b": 95, "c": 96, "d": 383, "e": None}, 384)
    assert labels == {"a": "Q1 [0,96)", "b": "Q1 [0,96)", "c": "Q2 [96,192)", "d": "Q4 [288,384)"}
    # App. C's example: mentions at 99 and 200 -> S(1); at 101 and 200 -> S(2); none -> left out.
    assert first_x_labels({"p": [200, 99], "q": [101, 200], "r": []}, 100) == {"p": "S100(1)", "q": "S100(2)"}


def _stride_example(qid: str, n: int) -> QAExample:
    """'Paris' after n filler sentences of 8 tokens, in a context long enough for several windows."""
    filler = "the cat is on the rug."
    ctx = " ".join([filler] * n) + " Paris is big. " + " ".join([filler] * 8)
    return QAExample(qid, "Which city?", ctx.strip(), [Answer("Paris", ctx.strip().index("Paris"))])


def test_s_x_counts_a_mention_in_the_front_of_any_window(tokenizer, monkeypatch):
    """§6.1: S_X^(1) holds the instances "at least one of whose answers is located in the front X
    tokens of the input sequence". With stride a mention at the rear of its first window can sit in
    the front of the next one, where the model can find it: that question is in S_X^(1)."""
    from posbias.qa import positions

    ex = [_stride_example("repeated", 5), _stride_example("rear", 6)]
    win = dict(max_seq_len=48, stride=16, max_query_len=8)
    first = gold_mention_positions(ex, tokenizer, **win)
    every = gold_mention_positions(ex, tokenizer, windows="every", **win)
    # 'repeated': position 45 in its first window, 19 in the next; 'rear': one window, position 27.
    assert first == {"repeated": [45], "rear": [27]} and every == {"repeated": [45, 19], "rear": [27]}
    assert first_x_labels(every, 24) == {"repeated": "S24(1)", "rear": "S24(2)"}
    assert first_x_labels(first, 24)["repeated"] == "S24(2)"  # the old first-window rule
    assert first_x_labels(every, 50) == {"repeated": "S50(1)", "rear": "S50(1)"}
    # The experiment segmenter follows §6.1.
    cfg = build_config(tiny_config(data={"max_seq_len": 48, "stride": 16, "max_query_len": 8}))  # win's
    monkeypatch.setattr(positions, "_checkpoint_setup", lambda checkpoint: (tokenizer, cfg))
    assert positions.first_x_tokens(ex, None, "ckpt", x=24) == {"repeated": "S24(1)", "rear": "S24(2)"}
    with pytest.raises(ValueError, match="windows"):
        gold_mention_positions(ex, tokenizer, windows="last", **win)


def test_predicted_positions_from_nbest():
    nbest = {"a": [{"text": "x", "token_start": 7}, {"text": "y", "token_start": 9}],
             "b": [{"text": "", "token_start": -1}, {"text": "z", "token_start": 3}]}
    assert predicted_start_positions(nbest, {"a": "y", "b": ""}) == {"a": 9, "b": None}


def test_improvement_categories_by_hand():
    gold = {"1": ["the Eiffel Tower"], "2": ["in 1889"], "3": ["Paris"], "4": ["red"]}
    base = {"1": "Louvre", "2": "built in 1889 by", "3": "Paris", "4": "red"}
    new = {"1": "Eiffel Tower", "2": "in 1889", "3": "Paris", "4": "blue"}
    c = improvement_categories(gold, base, new)
    # q1: F1 0 -> 1, no token shared with the baseline's answer: a correction. q2: F1 2/3 -> 1
    # (baseline P 2/4, R 2/2), shares "in 1889": a more precise boundary. q3 ties, q4 got worse.
    assert c == {"improved": 2, "corrections": 1, "boundaries": 1, "correction_share": 0.5, "boundary_share": 0.5}


def test_update_counter_matches_real_gradients(tokenizer, dev_examples):
    """Counted positions are exactly the rows of the position table that receive a gradient."""
    model = tiny_model(tokenizer)
    feats = build_qa_features(dev_examples[:6], tokenizer, max_seq_len=128, stride=48, train=True)
    counter = PositionUpdateCounter(512)
    for idx in (np.array([0, 1]), np.array([2, 3, 4])):
        model.zero_grad()
        batch = collate(feats, idx, pad_id=0, with_labels=True)
        batch["position_ids"] = model.position_ids(batch["attention_mask"]) + 5 * (batch["attention_mask"] > 0)
        model(batch, {k: batch[k] for k in ("start_positions", "end_positions")})["loss"].backward()
        grad_rows = set(torch.nonzero(model.encoder.embeddings.position_embeddings.weight.grad.abs().sum(1)).flatten().tolist())
        counter.add_batch(batch["position_ids"], batch["attention_mask"])
        counter.end_step()
        used = set(batch["position_ids"][batch["attention_mask"].bool()].unique().tolist())
        assert grad_rows == used
    assert counter.steps == 2 and counter.counts[5] == 2 and counter.counts[0] == 0  # shifted by 5: 0 unused
    assert PositionUpdateCounter.fractions(counter.to_dict())[5] == 1.0


def test_training_writes_position_updates(tmp_path):
    cfg = build_config(tiny_config(tmp_path, data={"eval_file": None}, train={"max_steps": 4})
                       | {"perturb": [{"name": "random_padding"}]})
    posbias.train(cfg, progress=False)
    base = build_config(tiny_config(tmp_path / "b", data={"eval_file": None}, train={"max_steps": 4}))
    posbias.train(base, progress=False)
    rp = json.loads((tmp_path / "run" / "position_updates.json").read_text(encoding="utf-8"))
    bl = json.loads((tmp_path / "b" / "run" / "position_updates.json").read_text(encoding="utf-8"))
    assert rp["steps"] == bl["steps"] == 4
    assert rp["counts"][0] == bl["counts"][0] == 4  # [CLS] at position 0 every step
    # Random Padding moves updates to the rear of the window (max_seq_len 128), never past it.
    assert sum(rp["counts"][96:128]) > sum(bl["counts"][96:128])
    assert sum(rp["counts"][128:]) == sum(bl["counts"][128:]) == 0


def test_diagnose_writes_position_analyses(tmp_path, tokenizer, dev_examples):
    cfg = build_config(tiny_config(tmp_path, train={"max_steps": 2}))
    posbias.train(cfg, progress=False)
    res = posbias.diagnose(tmp_path / "run" / "best", DEMO_DEV, tmp_path / "diag", xs=(40, 80),
                           overrides=["data.max_eval_examples=60"], progress=False)
    assert set(res["tables"]) == {"gold_position_quartile", "pred_position_quartile",
                                  "first_x_tokens(x=40)", "first_x_tokens(x=80)", "answer_length", "answer_sentence"}
    for rows in res["tables"].values():
        assert 0 < sum(r["questions"] for r in rows) <= 60
    s40 = {r["segment"]: r["questions"] for r in res["tables"]["first_x_tokens(x=40)"]}
    s80 = {r["segment"]: r["questions"] for r in res["tables"]["first_x_tokens(x=80)"]}
    assert s80.get("S80(1)", 0) >= s40.get("S40(1)", 0)  # a larger X puts more questions in S(1)
    # S_X as §6.1 (a mention in the front X tokens of any window), like the experiment segmenter.
    every = gold_mention_positions(dev_examples[:60], tokenizer, max_seq_len=128, stride=48, windows="every")
    labels = list(first_x_labels(every, 40).values())
    assert s40 == {s: labels.count(s) for s in set(labels)}
    for f in ("diagnosis.md", "diagnosis.html", "diagnosis.json", "f1_by_position.png", "position_updates.png",
              "eval/predictions.json"):
        assert (tmp_path / "diag" / f).is_file(), f
    page = (tmp_path / "diag" / "diagnosis.html").read_text(encoding="utf-8")
    # the position-bias block first, then one table per segmentation
    assert page.count("<table") == len(res["tables"]) + 1 and page.count("data:image/png;base64,") == 2
    # Any Hugging Face QA folder can be diagnosed too.
    hf = posbias.export(tmp_path / "run" / "best", tmp_path / "hf")
    res_hf = posbias.diagnose(hf, DEMO_DEV, tmp_path / "diag_hf", overrides=["data.max_eval_examples=60",
                                                                         "data.max_seq_len=128", "data.stride=48"],
                              progress=False)
    assert res_hf["metrics"]["total"] == 60


def test_position_plot_bins_hold_equal_counts_and_keep_ties_together(tmp_path):
    import numpy as np

    from posbias.qa.diagnose import equal_count_bins, plot_position_curve

    x = np.r_[np.zeros(50), np.arange(100, 250)]  # 50 answers at position 0: one bin, never split
    bins = equal_count_bins(x, min_size=30)
    assert sorted(np.concatenate(bins).tolist()) == list(range(200)) and all(len(b) >= 30 for b in bins)
    assert sum(any(x[i] == 0 for i in b) for b in bins) == 1 and len(bins) <= 8
    assert [len(b) for b in equal_count_bins(np.arange(45.0), min_size=30)] == [45]  # too few for two bins
    scores = {f"q{i}": (0.0, float(i % 2)) for i in range(200)}
    positions = {f"q{i}": int(p) for i, p in enumerate(x)}
    axis = {"rear": {"label": "Q2–Q4 [96,384)"}, "trend": {"ci": [-1.0, 2.0]}}
    assert plot_position_curve(positions, scores, 384, tmp_path / "a.png", "t", 30, axis).stat().st_size > 0
    assert plot_position_curve({}, {}, 384, tmp_path / "b.png").is_file()  # no locatable answer: an empty plot
