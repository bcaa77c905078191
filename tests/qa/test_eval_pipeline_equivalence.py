"""Windows assembled from texts tokenized once (`features.PairLayout`) equal the tokenizer's own pair
windows, field by field, and evaluation through them writes the same answers and metrics.

The tokenizer's windows (`pair_layout` returning None) are the reference: what posbias built for
every tokenizer before the layout path existed, and still builds for a tokenizer the layout does
not describe.
"""
import dataclasses

import numpy as np
import pytest
from transformers import AutoTokenizer

from posbias.config import RESOURCES, build_config
from posbias.qa import evaluate as ev
from posbias.qa import features as qf
from posbias.qa.features import TokenizedTexts, build_qa_features, pair_layout, window_lengths

from helpers import tiny_config, tiny_model

TOKENIZERS = ("tiny_tokenizer", "tiny_bpe_roberta", "tiny_bpe_gpt2")
SHORT = {"max_seq_len": 48, "stride": 12, "max_query_len": 8}  # many windows, questions cut
DATA = {"max_seq_len": 64, "stride": 16, "max_query_len": 16}


def _tokenizer(name: str, padding_side: str = "right"):
    tok = AutoTokenizer.from_pretrained(str(RESOURCES / name))
    tok.padding_side = padding_side
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    return tok


def _reference(monkeypatch):
    """From here on, windows come from the tokenizer's pair encoding."""
    monkeypatch.setattr(qf, "pair_layout", lambda tokenizer: None)


def _assert_same_features(a, b):
    assert len(a) == len(b)
    for name in ("input_ids", "token_type_ids", "offsets", "max_context", "question_mask"):
        xs, ys = getattr(a, name), getattr(b, name)
        assert (xs is None) == (ys is None), name
        for i, (x, y) in enumerate(zip(xs or [], ys or [])):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), f"{name}[{i}]"
    for name in ("cls_index", "example_index", "start_positions", "end_positions"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.stats == b.stats and a.null_candidate == b.null_candidate


@pytest.mark.parametrize("name", TOKENIZERS)
def test_the_bundled_tokenizers_have_a_pair_layout(name):
    layout = pair_layout(_tokenizer(name))
    assert layout is not None
    if name == "tiny_tokenizer":  # [CLS] q [SEP] c [SEP], types 0 then 1
        assert [len(p) for p in layout.parts] == [1, 1, 1] and layout.seq_types == (0, 1)


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("context_first", ["false", "true"])
@pytest.mark.parametrize("train", [False, True])
def test_layout_windows_equal_the_tokenizer_windows(name, context_first, train, dev_examples, monkeypatch):
    tok = _tokenizer(name)
    examples = dev_examples[:60]
    opts = dict(SHORT, context_first=context_first, train=train, unanswerable_windows="cls")
    fast = build_qa_features(examples, tok, **opts)
    lengths, owners = window_lengths(examples, tok, **{k: v for k, v in opts.items() if k in SHORT},
                                     context_first=context_first)
    _reference(monkeypatch)
    slow = build_qa_features(examples, tok, **opts)
    assert fast.stats["questions_truncated"] > 0 and len(slow) > 2 * len(examples)
    _assert_same_features(fast, slow)
    assert np.array_equal(lengths, slow.lengths) and np.array_equal(owners, slow.example_index)


def test_a_wrong_window_step_is_caught(dev_examples, monkeypatch):
    """The comparison above sees a window rule off by one token."""
    tok = _tokenizer("tiny_tokenizer")
    spans = qf._window_spans
    monkeypatch.setattr(qf, "_window_spans", lambda *a, stride, **k: spans(*a, stride=stride + 1, **k))
    fast = build_qa_features(dev_examples[:30], tok, **SHORT)
    _reference(monkeypatch)
    with pytest.raises(AssertionError):
        _assert_same_features(fast, build_qa_features(dev_examples[:30], tok, **SHORT))


def test_left_truncation_uses_the_tokenizer_windows():
    tok = _tokenizer("tiny_tokenizer")
    tok.truncation_side = "left"
    assert pair_layout(tok) is None


def test_too_long_questions_fail_as_the_tokenizer_does(dev_examples):
    """No room for the context: the tokenizer's own error, from the tokenizer's path."""
    tok = _tokenizer("tiny_tokenizer")
    e = dataclasses.replace(dev_examples[0], question=" ".join(["word"] * 60))
    with pytest.raises(Exception, match="tokenizer failed"):
        build_qa_features([e], tok, max_seq_len=48, stride=12, max_query_len=64)


@pytest.mark.parametrize("chunk_chars", [1 << 30, 6000])  # windows built at once; streamed
def test_evaluation_writes_the_same_answers_and_metrics(dev_examples, monkeypatch, chunk_chars):
    tok = _tokenizer("tiny_tokenizer")
    monkeypatch.setattr(ev, "EVAL_CHUNK_CHARS", chunk_chars)
    monkeypatch.setattr(ev, "EVAL_CACHE_TOKENS", 400)
    cfg = build_config(tiny_config(data=dict(DATA)))
    model = tiny_model(tok)
    examples = dev_examples[:120]
    fast = ev.predict_examples(model, tok, cfg, examples, source="demo", progress=False)
    _reference(monkeypatch)
    slow = ev.predict_examples(model, tok, cfg, examples, source="demo", progress=False)
    assert fast[0] == slow[0] and fast[1] == slow[1]  # predictions, n-best lists, to the character
    assert ev.score_predictions(examples, fast[0], fast[2], 1) == ev.score_predictions(examples, slow[0], slow[2], 1)
    assert any(fast[0].values())


@pytest.mark.parametrize("name", TOKENIZERS)
def test_texts_are_tokenized_alike_directly_and_through_transformers(name, dev_examples):
    """`TokenizedTexts` calls the Rust tokenizer itself only when that equals transformers' call;
    a truncation left set on it (as transformers leaves one) sends it through transformers."""
    tok = _tokenizer(name)
    texts = [e.context for e in dev_examples[:20]] + [e.question for e in dev_examples[:20]]
    direct = TokenizedTexts(tok)
    assert direct._backend() is not None
    a = direct.tokens_of(texts)
    tok.backend_tokenizer.enable_truncation(max_length=10_000)
    through = TokenizedTexts(tok)
    assert through._backend() is None
    b = through.tokens_of(texts)
    for (ids_a, offs_a), (ids_b, offs_b) in zip(a, b):
        assert np.array_equal(ids_a, ids_b) and np.array_equal(offs_a, offs_b)
