"""Windows, offsets and labels: the gold answer must survive windowing for every real question."""
import numpy as np
import pytest

from posbias.qa.examples import Answer, QAExample
from posbias.qa.features import build_qa_features
from posbias.errors import ConfigError, DataError
from posbias.qa.metrics import normalize_answer


def decoded(example, feats, w):
    o = feats.offsets[w]
    s, e = feats.start_positions[w], feats.end_positions[w]
    return example.context[o[s, 0]:o[e, 1]]


def check_labels_decode(examples, feats):
    """Every labelled window's tokens map back to the labelled answer text."""
    labelled = set()
    exact = 0
    for w in range(len(feats)):
        ex = examples[feats.example_index[w]]
        text = decoded(ex, feats, w)
        gold = ex.answers[0].text.strip()
        # Token boundaries may widen an answer that starts or ends inside a word ("$5" in "US$5").
        assert gold in text, (ex.id, gold, text)
        assert normalize_answer(gold) in normalize_answer(text)
        exact += text == gold
        labelled.add(ex.id)
    return labelled, exact


@pytest.mark.parametrize("max_seq_len, stride", [(384, 128), (96, 32)])
def test_gold_answer_decodes_from_every_window_label(tokenizer, dev_examples, max_seq_len, stride):
    feats = build_qa_features(dev_examples, tokenizer, max_seq_len=max_seq_len, stride=stride,
                              max_query_len=32, train=True, version=1)
    labelled, exact = check_labels_decode(dev_examples, feats)
    # Every question has at least one window that holds its (short) answer ...
    assert labelled == {e.id for e in dev_examples}
    # ... and nearly all labels are exact, not just covering.
    assert exact / len(feats) > 0.97
    assert (feats.lengths <= max_seq_len).all()
    if max_seq_len == 96:
        # long contexts really were split (and the windows without the answer dropped)
        assert len(feats) + feats.stats["windows_dropped_without_answer"] > 2 * len(dev_examples)


def test_context_first_left_padding_tokenizer(tokenizer, dev_examples):
    """XLNet-style tokenizers: context first, padded on the left; labels still decode."""
    tok = tokenizer.__class__.from_pretrained(tokenizer.name_or_path, padding_side="left")
    feats = build_qa_features(dev_examples[:60], tok, max_seq_len=96, stride=32, max_query_len=32,
                              train=True, version=1)
    labelled, _ = check_labels_decode(dev_examples, feats)
    assert len(labelled) == 60
    w = 0
    ctx = np.flatnonzero(feats.offsets[w][:, 0] >= 0)
    assert ctx[0] == 1  # [CLS] context ... : context starts right after [CLS]


def test_windows_without_answer_dropped_for_v1_and_cls_for_v2(tokenizer, dev_examples):
    """`unanswerable_windows="auto"` (build_qa_features' default, saved configs' value): the rule before
    issue 29. Runs default to `cls` for both versions (tests/qa/test_bert_preprocessing.py)."""
    ex = dev_examples[:40]
    v1 = build_qa_features(ex, tokenizer, max_seq_len=64, stride=16, max_query_len=24, train=True, version=1)
    v2 = build_qa_features(ex, tokenizer, max_seq_len=64, stride=16, max_query_len=24, train=True, version=2)
    allw = build_qa_features(ex, tokenizer, max_seq_len=64, stride=16, max_query_len=24, train=False)
    assert len(v2) == len(allw) > len(v1)
    assert v1.stats["windows_dropped_without_answer"] == len(allw) - len(v1)
    null = v2.start_positions == v2.cls_index
    assert null.sum() == v2.stats["windows_labelled_null"] == len(allw) - len(v1)
    assert (v2.end_positions[null] == v2.cls_index[null]).all()
    assert (allw.start_positions == -1).all()


def test_impossible_question_points_at_cls(tokenizer):
    ex = [QAExample(id="n", question="Who?", context="Nobody is named here at all.", is_impossible=True)]
    f = build_qa_features(ex, tokenizer, max_seq_len=64, stride=16, max_query_len=16, train=True, version=2)
    assert f.start_positions.tolist() == f.cls_index.tolist() == [0]
    with pytest.raises(DataError, match="no training window"):
        build_qa_features(ex, tokenizer, max_seq_len=64, stride=16, max_query_len=16, train=True, version=1)


def test_long_question_is_cut_not_crashing(tokenizer):
    q = "why " * 300
    ex = [QAExample(id="long", question=q, context="The answer is here.", answers=[Answer("here", 14)])]
    f = build_qa_features(ex, tokenizer, max_seq_len=64, stride=16, max_query_len=20, train=True)
    assert f.stats["questions_truncated"] == 1
    assert decoded(ex[0], f, 0) == "here"


def test_answer_whitespace_does_not_widen_label(tokenizer):
    ctx = "Paris is the capital of France."
    ex = [QAExample(id="s", question="Capital?", context=ctx, answers=[Answer(" Paris ", -1 + 1)])]
    ex[0].answers[0] = Answer(ctx[0:6], 0)  # "Paris " with the trailing space
    f = build_qa_features(ex, tokenizer, max_seq_len=64, stride=16, max_query_len=16, train=True)
    assert decoded(ex[0], f, 0) == "Paris"


def test_each_context_token_has_exactly_one_max_context_window(tokenizer, dev_examples):
    feats = build_qa_features(dev_examples[:30], tokenizer, max_seq_len=80, stride=40, max_query_len=24)
    for ex in range(30):
        windows = np.flatnonzero(feats.example_index == ex)
        owners = {}
        for w in windows:
            ctx = feats.offsets[w][:, 0] >= 0
            assert not (feats.max_context[w] & ~ctx).any()  # only context tokens
            for start in feats.offsets[w][feats.max_context[w], 0]:
                assert start not in owners
                owners[start] = w
        all_starts = set(np.concatenate([feats.offsets[w][feats.offsets[w][:, 0] >= 0, 0] for w in windows]))
        assert set(owners) == all_starts


def test_slow_tokenizer_is_refused():
    class Slow:
        is_fast = False

    with pytest.raises(ConfigError, match="fast"):
        build_qa_features([QAExample("a", "q", "c")], Slow())


def test_doc_stride_keyword_still_read_with_a_warning(tokenizer, dev_examples):
    """`build_qa_features(doc_stride=)` (its name before config version 2) builds the same windows as
    `stride=`, with a FutureWarning."""
    new = build_qa_features(dev_examples[:8], tokenizer, max_seq_len=64, stride=16)
    with pytest.warns(FutureWarning, match="stride"):
        old = build_qa_features(dev_examples[:8], tokenizer, max_seq_len=64, doc_stride=16)
    assert len(new) == len(old) > 8 and [list(x) for x in new.input_ids] == [list(x) for x in old.input_ids]
