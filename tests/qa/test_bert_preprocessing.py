"""BERT's original pre-processing for SQuAD v1 (issue 29, item 3): training windows without the answer
are labelled [CLS] and kept (`data.unanswerable_windows: cls`, the default), and a v1 model trained so
still answers and is scored as v1 — also on a `data build --keep-unanswerable` train set."""
import json

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import posbias
from posbias.config import build_config
from posbias.errors import ConfigError, DataError
from posbias.qa.collate import collate
from posbias.qa.examples import Answer, QAExample
from posbias.qa.features import build_qa_features, resolve_unanswerable_windows
from posbias.qa.readers import read_qa
from posbias.qa.truncate import build_dataset, truncate_fixed

from helpers import DEMO_DEV, DEMO_TRAIN, tiny_config, tiny_model

WINDOWS = dict(max_seq_len=64, stride=16, max_query_len=24)


@pytest.fixture(scope="module")
def d30(dev_examples):
    """D_30 of 60 dev questions with the answer-less ones kept (as `data build --keep-unanswerable`)."""
    return truncate_fixed(dev_examples[:60], 30, keep_unanswerable=True)


def test_d30_questions_without_a_training_window_get_cls_windows(tokenizer, d30):
    """The D_30 phenomenon: under `drop` a v1 question whose answer was cut off has no training
    window at all; under `cls` every window is kept, its windows labelled [CLS]."""
    answerless = {e.id for e in d30 if e.is_impossible}
    assert 0 < len(answerless) < len(d30)
    drop = build_qa_features(d30, tokenizer, train=True, version=1, unanswerable_windows="drop", **WINDOWS)
    cls = build_qa_features(d30, tokenizer, train=True, version=1, unanswerable_windows="cls", **WINDOWS)
    every = build_qa_features(d30, tokenizer, train=False, **WINDOWS)

    kept = lambda f: {d30[i].id for i in f.example_index}  # noqa: E731
    assert kept(drop) == {e.id for e in d30} - answerless  # whole questions lost
    assert drop.stats["examples_without_window"] == drop.stats["examples_without_answer_window"] == len(answerless)
    assert kept(cls) == {e.id for e in d30}  # "we do not remove any instances from training sets"
    assert len(cls) == len(every) == len(drop) + drop.stats["windows_dropped_without_answer"]
    assert cls.stats["examples_without_window"] == 0
    assert cls.stats["examples_without_answer_window"] == len(answerless)
    null = cls.start_positions == cls.cls_index
    assert null.sum() == cls.stats["windows_labelled_null"] == drop.stats["windows_dropped_without_answer"]
    assert (cls.end_positions[null] == cls.cls_index[null]).all()
    # every window of an answer-less question is a [CLS] window
    assert all(null[cls.example_index == i].all() for i, e in enumerate(d30) if e.is_impossible)
    assert cls.null_candidate and not drop.null_candidate and not every.null_candidate


def test_long_contexts_keep_their_answerless_windows(tokenizer, dev_examples):
    """Sliding windows of untruncated v1 contexts: the windows that miss the answer are kept as [CLS]."""
    ex = dev_examples[:40]
    drop = build_qa_features(ex, tokenizer, train=True, version=1, unanswerable_windows="drop", **WINDOWS)
    cls = build_qa_features(ex, tokenizer, train=True, version=1, unanswerable_windows="cls", **WINDOWS)
    assert drop.stats["windows_dropped_without_answer"] > 0 and cls.stats["windows_dropped_without_answer"] == 0
    assert len(cls) == len(drop) + drop.stats["windows_dropped_without_answer"]
    # The answer-holding windows and their labels are the same under both.
    spans = cls.start_positions != cls.cls_index
    assert cls.start_positions[spans].tolist() == drop.start_positions.tolist()
    assert cls.example_index[spans].tolist() == drop.example_index.tolist()


def test_auto_is_the_old_behaviour_and_cls_the_default():
    assert resolve_unanswerable_windows("auto", 1) == "drop" and resolve_unanswerable_windows("auto", 2) == "cls"
    assert resolve_unanswerable_windows("cls", 1) == "cls"
    assert build_config(tiny_config()).data.unanswerable_windows == "cls"
    with pytest.raises(ConfigError, match="data.unanswerable_windows"):
        build_config(tiny_config(data={"unanswerable_windows": "null"}))
    # A saved config (checkpoint, recorded run) says `auto`: its v1 windows are still dropped.
    saved = build_config(tiny_config(data={"unanswerable_windows": "auto"}), saved=True)
    assert saved.data.unanswerable_windows == "auto"
    assert saved.hash() != build_config(tiny_config()).hash()


def test_v1_all_cls_training_set_is_refused(tokenizer):
    ex = [QAExample(id="n", question="Who?", context="Nobody is named here at all.", is_impossible=True)]
    with pytest.raises(DataError, match="no training window"):
        build_qa_features(ex, tokenizer, train=True, version=1, unanswerable_windows="cls", **WINDOWS)


def test_v1_head_trains_on_cls_labels_over_context_and_cls(tokenizer, d30):
    """[CLS] joins the softmax of a v1 head's training batches (else a [CLS] label had a loss of ~1e38);
    the loss is the cross-entropy over context tokens plus [CLS] (Eq. 1-2 with BERT's null label)."""
    feats = build_qa_features(d30, tokenizer, train=True, version=1, unanswerable_windows="cls", **WINDOWS)
    idx = np.r_[np.flatnonzero(feats.start_positions == feats.cls_index)[:3],
                np.flatnonzero(feats.start_positions != feats.cls_index)[:3]]
    batch = collate(feats, idx, pad_id=0, with_labels=True)
    cand = batch["span_mask"]
    rows = torch.arange(len(idx))
    assert cand[rows, batch["cls_index"]].all()
    assert (cand.sum(1) == torch.tensor([(o[:, 0] >= 0).sum() + 1 for o in (feats.offsets[w] for w in idx)])).all()
    model = tiny_model(tokenizer).eval()  # a v1 model: no null answer
    assert not model.null_answer
    targets = {k: batch[k] for k in ("start_positions", "end_positions")}
    out = model(batch, targets)
    logits = model.head.qa_outputs(model.encode(batch)).double()
    manual = []
    for r in range(len(idx)):
        c = torch.nonzero(cand[r]).flatten()
        for k, t in ((0, targets["start_positions"][r]), (1, targets["end_positions"][r])):
            manual.append(-F.log_softmax(logits[r, c, k], dim=0)[(c == t).nonzero()[0, 0]])
    assert out["loss"].item() == pytest.approx(torch.stack(manual).mean().item(), rel=1e-4)
    assert out["loss"].item() < 20
    # Evaluation windows of the same questions: [CLS] is no candidate (a v1 answer is a context span).
    ev = build_qa_features(d30, tokenizer, train=False, **WINDOWS)
    eb = collate(ev, np.arange(4), pad_id=0)
    assert not eb["span_mask"][torch.arange(4), eb["cls_index"]].any()


def test_keep_unanswerable_build_trains_and_evaluates_as_v1(tmp_path):
    """`data build --keep-unanswerable` of a v1 file stays v1.1: `data.version: auto` trains a v1 model
    on it ([CLS] windows for the answer-less questions), evaluated by v1 rules with span answers."""
    stats = build_dataset([DEMO_TRAIN], tmp_path / "train", truncate=30, keep_unanswerable=True, name="train",
                          sample=60, seed=3)
    build_dataset([DEMO_DEV], tmp_path / "dev", truncate=30, split=True, sample=20, seed=3)
    train = read_qa(tmp_path / "train" / "train.json")
    assert train.version == "1.1" and stats["splits"]["train"]["version"] == "1.1"
    assert train.has_impossible and not train.null_answers
    cfg = build_config(tiny_config(tmp_path, data={
        "train_file": str(tmp_path / "train" / "train.json"), "eval_file": str(tmp_path / "dev" / "val.json"),
        "max_train_examples": None, "max_eval_examples": None}, train={"max_steps": 2}))
    summary = posbias.train(cfg, progress=False)
    info = json.loads((tmp_path / "run" / "run_info.json").read_text(encoding="utf-8"))
    answerless = sum(e.is_impossible for e in train.examples)
    assert info["data_version"] == 1
    assert info["train_features"]["examples_without_window"] == 0
    assert info["train_features"]["examples_without_answer_window"] >= answerless > 0
    ev = summary["eval"]
    assert "exact_match" in ev and "exact" not in ev and "NoAns_total" not in ev  # SQuAD v1.1 metrics
    preds = json.loads((tmp_path / "run" / "eval" / "predictions.json").read_text(encoding="utf-8"))
    assert len(preds) == 20 and all(p for p in preds.values())  # never the empty ([CLS]) answer
    odds = json.loads((tmp_path / "run" / "eval" / "null_odds.json").read_text(encoding="utf-8"))
    assert odds == {}
    from posbias.checkpoint import load_checkpoint

    model, _, saved = load_checkpoint(tmp_path / "run" / "best", task="qa")
    assert not model.null_answer and saved.data.unanswerable_windows == "cls"


def test_v2_files_keep_their_null_answers(tmp_path):
    """A v2 input keeps writing v2 files when answer-less instances are kept; unversioned files with
    unanswerable questions are still v2."""
    examples = read_qa(DEMO_DEV).examples[:30]
    data = [{"title": "t", "paragraphs": [{"context": e.context, "qas": [{
        "id": e.id, "question": e.question, "is_impossible": i % 3 == 0,
        "answers": [] if i % 3 == 0 else [{"text": a.text, "answer_start": a.start} for a in e.answers]}]}]}
        for i, e in enumerate(examples)]
    for version in ("v2.0", None):
        top = {"data": data} | ({"version": version} if version else {})
        (tmp_path / "v2.json").write_text(json.dumps(top), encoding="utf-8")
        assert read_qa(tmp_path / "v2.json").null_answers
    build_dataset([str(tmp_path / "v2.json")], tmp_path / "out", truncate=40, keep_unanswerable=True)
    out = read_qa(tmp_path / "out" / "data.json")
    assert out.version == "2.0" and out.null_answers


def test_v1_answer_examples_unchanged_by_the_option(tokenizer):
    """A question whose every window holds the answer trains identically under both options."""
    ex = [QAExample(id="a", question="Which city?", context="Paris is the capital of France.",
                    answers=[Answer("Paris", 0)])]
    a = build_qa_features(ex, tokenizer, train=True, version=1, unanswerable_windows="drop", **WINDOWS)
    b = build_qa_features(ex, tokenizer, train=True, version=1, unanswerable_windows="cls", **WINDOWS)
    assert a.start_positions.tolist() == b.start_positions.tolist() and len(a) == len(b) == 1
    # No window labelled [CLS]: [CLS] stays out of the softmax (Eq. 1-2), the batches are equal.
    assert not b.null_candidate
    ba, bb = collate(a, [0], pad_id=0, with_labels=True), collate(b, [0], pad_id=0, with_labels=True)
    assert ba.keys() == bb.keys() and all(torch.equal(ba[k], bb[k]) for k in ba)
