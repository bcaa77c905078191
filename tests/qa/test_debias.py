"""`train.debias` (Ko et al. 2020 §5 with Clark et al. 2019's ensembles): the losses, the answer
prior, the config, and that predictions never depend on the prior or the gate."""
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F

import posbias
from posbias.config import build_config
from posbias.errors import ConfigError, TrainingError
from posbias.qa.collate import collate
from posbias.qa.config import DebiasConfig
from posbias.qa.debias import (NULL, OFFSET, SENTENCE_BUCKETS, UNSEEN, AnswerPrior, Debias, answer_prior,
                               cosine_entropy, ensemble_cross_entropy, make_debias, masked_entropy, prior_index,
                               sentence_columns, sentence_prior)
from posbias.qa.examples import Answer, QAExample
from posbias.qa.features import QAFeatures, build_qa_features
from posbias.qa.heads.span_scores import masked_logits
from posbias.qa.model import QAModel, debias_for
from posbias.qa.sentences import sentence_index
from posbias.qa.task import QATask
from posbias.perturb.position_shift import random_padding

from helpers import DEMO_DEV, assert_close_to_scale, tiny_config, tiny_model


@pytest.fixture(scope="module")
def feats(tokenizer, dev_examples):
    return build_qa_features(dev_examples[:12], tokenizer, max_seq_len=96, stride=32, max_query_len=24,
                             train=True, version=1, unanswerable_windows="cls")


def batch_and_targets(feats, n=6):
    batch = collate(feats, np.arange(n), pad_id=0, with_labels=True)
    return batch, {k: batch[k] for k in ("start_positions", "end_positions")}


def uniform_prior(length: int, level: str = "token", columns=None) -> AnswerPrior:
    p = 1 / (length + 1)
    return AnswerPrior(np.full(length, p), np.full(length, p), p, p, 10, 1.0, level, columns)


def peaked_prior(length: int, at: int = 0, mass: float = 0.999, level: str = "token", columns=None) -> AnswerPrior:
    """Almost all mass on context offset (or sentence bucket) `at`: a prior that would move any
    prediction it entered."""
    rest = (1 - mass) / (length + 1)
    p = np.full(length, rest)
    p[at] += mass
    return AnswerPrior(p, p.copy(), rest, rest, 10, 1.0, level, columns)


def debiased(model: QAModel, method: str, bias: AnswerPrior | None, **options) -> QAModel:
    """`model`'s encoder and head (shared) with the de-biasing `method` and the answer prior `bias`
    (`options`: the other keys of train.debias)."""
    cfg = DebiasConfig(method=method, **options)
    return QAModel(model.encoder, model.head, model.head_name, model.null_answer,
                   debias=debias_for(model.encoder, model.head_name, cfg, bias))


# ------------------------------------------------------------------------------------------ losses
def test_bias_product_with_a_uniform_prior_is_the_plain_loss():
    torch.manual_seed(0)
    logits = torch.randn(4, 9, dtype=torch.float64) * 3
    mask = torch.rand(4, 9) > 0.3
    mask[:, 2] = True
    target = torch.tensor([2, 2, 2, 2])
    plain = F.cross_entropy(masked_logits(logits, mask), target)
    for constant in (math.log(1 / 9), -40.0):
        log_b = torch.full_like(logits, constant)
        got = ensemble_cross_entropy(logits, log_b, mask, target)
        assert got.dtype == torch.float64
        assert abs(got.item() - plain.item()) <= 1e-12 * abs(plain.item())
    # Not vacuous: a prior that is not uniform over the candidates changes the loss.
    log_b = torch.zeros_like(logits)
    log_b[:, 2] = -3.0
    assert ensemble_cross_entropy(logits, log_b, mask, target).item() > plain.item() + 0.1


def test_model_loss_with_a_uniform_prior_equals_the_heads_loss(tokenizer, feats):
    base = tiny_model(tokenizer).eval()
    batch, targets = batch_and_targets(feats)
    plain = base(batch, targets)["loss"]
    model = debiased(base, "bias_product", uniform_prior(96)).eval()
    assert_close_to_scale(model(batch, targets)["loss"], plain, 1e-6, "bias product, uniform prior")
    assert abs(debiased(base, "bias_product", peaked_prior(96, 5)).eval()(batch, targets)["loss"] - plain) > 0.1


@pytest.mark.parametrize("level, bias_term", [("token", "log"), ("sentence", "log"), ("sentence", "probability")])
def test_bias_product_and_learned_mixin_losses_by_hand(tokenizer, feats, dev_examples, level, bias_term):
    """CE(log p_main + g · log b) with b read at each candidate's context offset, or its sentence
    (or [CLS]), over the head's candidates, averaged over start and end: recomputed here one window
    at a time. `bias_term: probability` (the authors' code) adds g · b instead of g · log b."""
    batch, targets = batch_and_targets(feats)
    if level == "token":
        prior = answer_prior(feats, 96, smoothing=0.5)
        at = lambda r, t, first: t - first  # noqa: E731
    else:
        prior = sentence_prior(feats, dev_examples[:12], smoothing=0.5)
        at = lambda r, t, first: min(sentence_index(dev_examples[feats.example_index[r]].context,  # noqa: E731
                                                    int(feats.offsets[r][t, 0])), SENTENCE_BUCKETS) - 1
    base = tiny_model(tokenizer).eval()
    logits = base.head.qa_outputs(base.encode(batch)).double()  # (b, s, 2)
    for method in ("bias_product", "learned_mixin"):
        model = debiased(base, method, prior, prior=level, bias_term=bias_term).eval()
        g = torch.ones(6, dtype=torch.float64)
        if method == "learned_mixin":
            cls_states = base.encode(batch)[torch.arange(6), batch["cls_index"]]
            g = F.softplus(model.debias.gate(cls_states)).squeeze(-1).double()
        manual = []
        for r in range(6):
            cand = torch.nonzero(batch["span_mask"][r]).flatten().tolist()
            first = int(np.argmax(feats.offsets[r][:, 0] >= 0))
            for k, (p, gold) in enumerate(((prior.start, targets["start_positions"][r]),
                                            (prior.end, targets["end_positions"][r]))):
                b = [prior.null if t == batch["cls_index"][r] else p[at(r, t, first)] for t in cand]
                log_b = torch.tensor(b if bias_term == "probability" else [math.log(x) for x in b],
                                     dtype=torch.float64)
                combined = F.log_softmax(logits[r, cand, k], 0) + g[r] * log_b
                manual.append(-F.log_softmax(combined, 0)[cand.index(int(gold))])
        assert_close_to_scale(model(batch, targets)["loss"], torch.stack(manual).mean(), 1e-5, (method, level))


def test_learned_mixin_gate_gets_a_gradient(tokenizer, feats):
    batch, targets = batch_and_targets(feats)
    prior = answer_prior(feats, 96)
    for gate in ("cls", "max"):
        for gate_bias in (None, True):  # the default: no bias term (Clark et al.); before version 3: one
            model = debiased(tiny_model(tokenizer), "learned_mixin", prior, gate=gate, gate_bias=gate_bias)
            model(batch, targets)["loss"].backward()
            g = model.debias.gate
            assert g.weight.grad is not None and g.weight.grad.abs().sum() > 0, gate
            if gate_bias:
                assert g.bias.grad.abs().sum() > 0, gate
            else:
                assert g.bias is None, gate


def test_training_stats_report_the_gate_the_bias_was_scaled_by(tokenizer, feats):
    prior = answer_prior(feats, 96)
    model = debiased(tiny_model(tokenizer), "learned_mixin", prior, gate="cls")
    for m in model.modules():  # training mode without dropout: the hand computation sees the same states
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    assert model.training_stats() == {}  # before a batch
    seen = []
    for rows in (np.arange(4), np.arange(4, 8)):  # two batches, then one read
        batch = collate(feats, rows, pad_id=0, with_labels=True)
        targets = {k: batch[k] for k in ("start_positions", "end_positions")}
        model.train()
        model(batch, targets)
        with torch.no_grad():  # g(x) = softplus(w . h_[CLS] + c), by hand
            h = model.encode(batch)[torch.arange(4), batch["cls_index"]]
            seen.append(F.softplus(model.debias.gate(h)).squeeze(-1).double())
    g = torch.cat(seen)
    stats = model.training_stats()
    assert stats["debias_gate_mean"] == pytest.approx(g.mean().item(), rel=1e-5)
    assert stats["debias_gate_min"] == pytest.approx(g.min().item(), rel=1e-5)
    assert stats["debias_gate_max"] == pytest.approx(g.max().item(), rel=1e-5)
    assert g.max() > g.min()  # distinct rows: min, mean and max are three different checks
    assert model.training_stats() == {}  # read once, then forgotten
    batch, targets = batch_and_targets(feats)
    model.eval()
    model(batch, targets)  # an evaluation pass with targets is not training
    assert model.training_stats() == {}
    model.train()
    plain = debiased(tiny_model(tokenizer), "bias_product", prior)
    plain(batch, targets)
    assert plain.training_stats() == {}  # no gate


def test_learned_mixin_h_adds_the_entropy_of_the_scaled_prior(tokenizer, feats):
    batch, targets = batch_and_targets(feats)
    prior = answer_prior(feats, 96)
    torch.manual_seed(3)
    mixin = debiased(tiny_model(tokenizer), "learned_mixin", prior).eval()
    with_h = debiased(mixin, "learned_mixin_h", prior, entropy_weight=0.7).eval()
    with_h.debias.gate.load_state_dict(mixin.debias.gate.state_dict())
    a, b = mixin(batch, targets)["loss"], with_h(batch, targets)["loss"]
    # By hand: w_H · mean over the batch of (H_start + H_end) / 2, H of softmax(g(x) log b) over the candidates.
    tokens = mixin.encode(batch)
    g = F.softplus(mixin.debias.gate(tokens[torch.arange(6), batch["cls_index"]]))  # (b, 1)
    table = prior.log_table()[:, prior_index(batch, 96)]
    mask = batch["span_mask"]
    penalty = sum(masked_entropy(g * table[k], mask) for k in (0, 1)) / 2
    assert (b - a).item() > 0
    assert_close_to_scale(b - a, 0.7 * penalty.mean(), 1e-5, "+H term")


def test_entropy_regularisation_matches_a_hand_computation():
    words = torch.tensor([[[1.0, 0.0]] * 4], dtype=torch.float64)  # (1, 4, 2)
    hidden = torch.tensor([[[2.0, 0.0], [0.0, 3.0], [-1.0, 0.0], [1.0, 1.0]]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False]])
    # cos = 1, 0, -1 over the candidates (position 3, cos 1/√2, is not one).
    z = math.exp(1) + 1 + math.exp(-1)
    p = [math.exp(1) / z, 1 / z, math.exp(-1) / z]
    h = -sum(q * math.log(q) for q in p)
    assert abs(cosine_entropy(words, hidden, mask).item() - h) < 1e-12
    debias = Debias("entropy", 2, entropy_weight=8.0)
    loss = debias.loss({"loss": torch.tensor(2.0, dtype=torch.float64)}, hidden, {}, {}, mask, words)
    assert abs(loss.item() - (2.0 - 8 * h)) < 1e-12
    assert abs(cosine_entropy(words, hidden, torch.ones(1, 4, dtype=torch.bool)).item() - h) > 0.1


def test_entropy_regularisation_in_the_model_is_the_heads_loss_minus_the_weighted_entropy(tokenizer, feats):
    batch, targets = batch_and_targets(feats)
    base = tiny_model(tokenizer).eval()
    model = debiased(base, "entropy", None).eval()
    words = base.encoder.get_input_embeddings()(batch["input_ids"])
    h = cosine_entropy(words, base.encode(batch), batch["span_mask"]).mean()
    assert_close_to_scale(model(batch, targets)["loss"], base(batch, targets)["loss"] - 8.0 * h, 1e-6, "entropy")


# ------------------------------------------------------------------------------------------ prior
def constructed_features(answer_offsets, null_windows=1):
    """Windows [CLS] q q q [SEP] c*16 [SEP]: the context starts at token 5; answers at the given
    context offsets (start = end), plus `null_windows` windows labelled [CLS]."""
    n = len(answer_offsets) + null_windows
    offsets = np.full((22, 2), -1, dtype=np.int64)
    offsets[5:21] = np.stack([np.arange(16) * 4, np.arange(16) * 4 + 3], 1)
    starts = np.array([5 + o for o in answer_offsets] + [0] * null_windows, dtype=np.int64)
    return QAFeatures(input_ids=[np.arange(22)] * n, token_type_ids=None, offsets=[offsets] * n,
                      max_context=[np.ones(22, bool)] * n, cls_index=np.zeros(n, np.int64),
                      example_index=np.arange(n), start_positions=starts, end_positions=starts + 0)


def test_prior_sums_to_one_and_peaks_at_the_training_answers():
    feats = constructed_features([3, 4, 5] * 10)
    prior = answer_prior(feats, 32, smoothing=1.0)
    for p in (prior.start, prior.end):
        assert abs(p.sum() + prior.null - 1) < 1e-12 and (p > 0).all()
        assert set(np.argsort(p)[-3:]) == {3, 4, 5}
        # Add-one smoothing: (10 + 1) / (31 + 33) at offsets 3..5, 1 / 64 elsewhere.
        assert p[4] == pytest.approx(11 / 64) and p[0] == pytest.approx(1 / 64)
    assert prior.null == pytest.approx(2 / 64) and prior.unseen == pytest.approx(1 / 64)
    moved = answer_prior(constructed_features([9] * 30), 32)
    assert moved.start.argmax() == 9
    back = AnswerPrior.from_dict(json.loads(json.dumps(prior.to_dict())))
    assert np.array_equal(back.start, prior.start) and back.null == prior.null


def test_prior_index_reads_offsets_in_the_windows_context(feats):
    batch = collate(feats, np.arange(len(feats)), pad_id=0, with_labels=True)
    idx = prior_index(batch, 96)
    for r in range(len(feats)):
        ctx = np.flatnonzero(feats.offsets[r][:, 0] >= 0)
        assert idx[r, batch["cls_index"][r]] == NULL
        assert idx[r, torch.from_numpy(ctx)].tolist() == list(range(OFFSET, OFFSET + len(ctx)))
        question = feats.question_mask[r]
        assert (idx[r, torch.from_numpy(np.flatnonzero(question))] == UNSEEN).all()
    # Left padding moves the tokens, not their columns.
    left = collate(feats, np.arange(len(feats)), pad_id=0, padding_side="left", with_labels=True)
    real_r, real_l = batch["attention_mask"].bool(), left["attention_mask"].bool()
    assert torch.equal(idx[real_r], prior_index(left, 96)[real_l])
    # The prior counts exactly these columns at the labels.
    prior = answer_prior(feats, 96, smoothing=1.0)
    gold = idx[torch.arange(len(feats)), batch["start_positions"]]
    counts = np.bincount(gold.numpy(), minlength=98)
    denom = len(feats) + 97
    assert np.allclose(prior.start, (counts[OFFSET:] + 1) / denom)
    assert prior.null == pytest.approx((counts[NULL] + 1) / denom)


# A paragraph of 3 sentences whose abbreviations (Dr., St., U.S.) a split at every ". " would take
# for sentence ends; its sentence starts are written out by hand, not by the segmenter.
PARAGRAPH = ("Dr. Smith moved to St. Louis in 1990. He taught at the U.S. Naval Academy for ten years. "
             "His son was born there.")
SENTENCE_STARTS = (0, PARAGRAPH.index("He taught"), PARAGRAPH.index("His son"))


def hand_sentence(char: int) -> int:
    """1-based sentence of PARAGRAPH holding character `char`."""
    return sum(char >= s for s in SENTENCE_STARTS)


def paragraph_features(tokenizer, answers, **windows):
    examples = [QAExample(id=f"q{i}", question="Who?", context=PARAGRAPH, answers=[Answer(a, PARAGRAPH.index(a))])
                for i, a in enumerate(answers)]
    options = {"max_seq_len": 128, "stride": 32, **windows}
    return examples, build_qa_features(examples, tokenizer, max_query_len=8, train=True, version=1,
                                       unanswerable_windows="cls", **options)


def test_sentence_prior_of_answers_all_in_the_first_sentence(tokenizer):
    examples, feats = paragraph_features(tokenizer, ["Smith", "St. Louis", "1990", "Dr. Smith"])
    assert len(feats) == 4 and (feats.start_positions != feats.cls_index).all()  # one window each, no null
    prior = sentence_prior(feats, examples, smoothing=1.0)
    denom = 4 + (SENTENCE_BUCKETS + 1)
    for p in (prior.start, prior.end):
        assert len(p) == SENTENCE_BUCKETS and abs(p.sum() + prior.null - 1) < 1e-12
        assert p.argmax() == 0 and p[0] == pytest.approx(5 / denom)
        assert np.allclose(p[1:], 1 / denom)
    assert prior.null == pytest.approx(1 / denom) and prior.unseen == pytest.approx(1 / denom)
    assert prior.summary()["start_mode"] == 1  # sentence 1
    back = AnswerPrior.from_dict(json.loads(json.dumps(prior.to_dict())))
    assert back.level == "sentence" and np.array_equal(back.start, prior.start) and back.window_columns is None


def assert_bias_is_the_sentence_prior(debias: Debias, feats, prior: AnswerPrior, padding_side: str = "right"):
    """Every token of every window gets log p(its sentence) (start and end rows), by hand."""
    batch = collate(feats, np.arange(len(feats)), pad_id=0, padding_side=padding_side, with_labels=True)
    table = prior.log_table()[:, debias.table_columns(batch, torch.device("cpu"))]  # (2, b, s)
    for r in range(len(feats)):
        at = int(batch["pad_left"][r])  # window token j sits at column at + j
        for j, (c, _) in enumerate(feats.offsets[r]):
            if j == feats.cls_index[r]:
                want = [prior.null, prior.null]
            elif c < 0:
                want = [prior.unseen, prior.unseen]  # question and separators
            else:
                k = hand_sentence(int(c))
                want = [prior.start[k - 1], prior.end[k - 1]]
            assert table[:, r, at + j].tolist() == pytest.approx([math.log(w) for w in want], rel=1e-6), (r, j)


def test_each_token_gets_the_prior_of_its_sentence(tokenizer):
    # Answers in sentences 1, 1, 1, 2, 3 and one from sentence 1 into 2, in short windows: some are
    # labelled [CLS] (the null), later ones start inside sentence 2, the labelled windows give
    # sentences 1, 2, 3 distinct start counts, and the start and end counts differ.
    examples, feats = paragraph_features(tokenizer, ["Smith", "St. Louis", "1990", "Naval Academy", "son",
                                                     "1990. He taught"], max_seq_len=24, stride=8)
    ctx_starts = [int(o[o[:, 0] >= 0][0, 0]) for o in feats.offsets]
    assert any(hand_sentence(c) > 1 for c in ctx_starts)  # the sentence is the context's, not the window's
    # sentencex agrees with the hand split at every token (a split at ". " would not: Dr., St., U.S.).
    for o in feats.offsets:
        for c in o[o[:, 0] >= 0, 0]:
            assert sentence_index(PARAGRAPH, int(c)) == hand_sentence(int(c))
    prior = sentence_prior(feats, examples, smoothing=0.5)
    null = feats.start_positions == feats.cls_index
    assert 0 < null.sum() < len(feats)
    denom = len(feats) + 0.5 * (SENTENCE_BUCKETS + 1)
    for p, labels in ((prior.start, feats.start_positions), (prior.end, feats.end_positions)):
        counts = np.bincount([hand_sentence(int(feats.offsets[r][labels[r], 0])) - 1 for r in np.flatnonzero(~null)],
                             minlength=SENTENCE_BUCKETS)
        assert np.allclose(p, (counts + 0.5) / denom)
    assert len(set(np.round(prior.start[:3], 12))) == 3 and not np.allclose(prior.start, prior.end)
    assert prior.null == pytest.approx((null.sum() + 0.5) / denom)
    debias = Debias("bias_product", 8, prior_level="sentence")
    debias.set_prior(prior)
    for side in ("right", "left"):
        assert_bias_is_the_sentence_prior(debias, feats, prior, side)
    # A table keyed by the token's index in the window's context instead of its sentence fails.
    wrong = prior.window_columns.copy()
    for r, o in enumerate(feats.offsets):
        ctx = np.flatnonzero(o[:, 0] >= 0)
        wrong[r, ctx] = OFFSET + np.minimum(np.arange(len(ctx)), SENTENCE_BUCKETS - 1)
    debias.window_columns = torch.from_numpy(wrong)
    with pytest.raises(AssertionError):
        assert_bias_is_the_sentence_prior(debias, feats, prior)


def test_sentences_past_the_cap_share_the_last_bucket(tokenizer):
    context = " ".join(f"Line {i} ends." for i in range(1, 41))
    answer = "Line 35"
    examples = [QAExample(id="q", question="Which?", context=context, answers=[Answer(answer, context.index(answer))])]
    feats = build_qa_features(examples, tokenizer, max_seq_len=256, stride=32, max_query_len=8, train=True,
                              version=1, unanswerable_windows="cls")
    assert len(feats) == 1 and sentence_index(context, context.index(answer)) == 35
    columns = sentence_columns(feats, examples)
    ctx = np.flatnonzero(feats.offsets[0][:, 0] >= 0)
    sentences = np.array([sentence_index(context, int(c)) for c in feats.offsets[0][ctx, 0]])
    assert sentences.max() == 40
    assert np.array_equal(columns[0, ctx], OFFSET + np.minimum(sentences, SENTENCE_BUCKETS) - 1)
    prior = sentence_prior(feats, examples, smoothing=1.0)
    assert prior.start.argmax() == prior.end.argmax() == SENTENCE_BUCKETS - 1


def test_position_shifts_move_no_token_out_of_its_sentence(tokenizer, feats, dev_examples):
    prior = sentence_prior(feats, dev_examples[:12])
    debias = Debias("bias_product", 8, prior_level="sentence")
    debias.set_prior(prior)
    batch, _ = batch_and_targets(feats)
    shift = random_padding(max_seq_len=512)
    moved = shift(batch, torch.Generator().manual_seed(0))
    assert (moved["position_ids"] != torch.arange(batch["input_ids"].shape[1])).any()
    cpu = torch.device("cpu")
    assert torch.equal(debias.table_columns(moved, cpu), debias.table_columns(batch, cpu))


def test_bias_product_with_a_uniform_sentence_prior_is_the_heads_loss(tokenizer, feats, dev_examples):
    base = tiny_model(tokenizer).eval()
    batch, targets = batch_and_targets(feats)
    plain = base(batch, targets)["loss"]
    columns = sentence_columns(feats, dev_examples[:12])
    uniform = uniform_prior(SENTENCE_BUCKETS, "sentence", columns)
    model = debiased(base, "bias_product", uniform, prior="sentence").eval()
    assert_close_to_scale(model(batch, targets)["loss"], plain, 1e-6, "bias product, uniform sentence prior")
    # Not vacuous: the windows span several sentences, and a prior peaked on one moves the loss.
    peaked = peaked_prior(SENTENCE_BUCKETS, 1, level="sentence", columns=columns)
    assert abs(debiased(base, "bias_product", peaked, prior="sentence").eval()(batch, targets)["loss"] - plain) > 0.1


def test_the_prior_must_be_of_the_configured_level(feats, dev_examples):
    with pytest.raises(ConfigError, match="train.debias.prior is 'token'"):
        Debias("bias_product", 8).set_prior(sentence_prior(feats, dev_examples[:12]))
    saved = AnswerPrior.from_dict(sentence_prior(feats, dev_examples[:12]).to_dict())  # no window table
    debias = Debias("bias_product", 8, prior_level="sentence")
    debias.set_prior(saved)
    batch, _ = batch_and_targets(feats)
    with pytest.raises(TrainingError, match="no sentence table"):
        debias.table_columns(batch, torch.device("cpu"))


@pytest.mark.parametrize("level", ["token", "sentence"])
def test_the_task_computes_the_prior_from_the_training_features(tokenizer, level):
    task = QATask()
    cfg = build_config(tiny_config(train={"debias": {"method": "bias_product", "prior": level}}))
    ds = task.read("demo:train", cfg)
    examples = ds.examples[:30]
    feats = task.train_features(examples, tokenizer, cfg, ds)
    expected = (answer_prior(feats, cfg.data.max_seq_len, 1.0) if level == "token"
                else sentence_prior(feats, examples, 1.0))
    prior = feats.answer_prior  # the prior travels on the features, not on the task object
    assert prior.level == level and np.array_equal(prior.start, expected.start)
    model = task.build_model(cfg, tokenizer, ds, feats)
    assert model.debias.prior is prior
    assert (model.debias.window_columns is not None) == (level == "sentence")
    # Features built without train.debias carry no prior: a debias model cannot be built from them.
    other = task.read("demo:dev", cfg)
    plain = task.train_features(other.examples[:10], tokenizer, build_config(tiny_config()), other)
    with pytest.raises(TrainingError, match="train.debias"):
        task.build_model(cfg, tokenizer, other, plain)


# ------------------------------------------------------------------------------------------ config
def test_debias_is_off_by_default_and_leaves_config_and_hash_alone():
    cfg = build_config(tiny_config())
    assert cfg.train.debias is None and "debias" not in cfg.to_dict()["train"]
    assert build_config(tiny_config(train={"debias": None})).hash() == cfg.hash()
    on = build_config(tiny_config(), ["train.debias.method=learned_mixin"])
    assert on.hash() != cfg.hash() and on.to_dict()["train"]["debias"]["gate"] == "cls"
    assert build_config(on.to_dict()).hash() == on.hash()


def test_the_prior_key_at_its_default_leaves_the_saved_config_and_hash_alone():
    """`train.debias.prior: token` is what every debias config meant before the key existed."""
    before = {"method": "learned_mixin", "gate": "cls", "entropy_weight": None, "smoothing": 1.0}
    old = build_config(tiny_config(train={"debias": before}))
    token = build_config(tiny_config(train={"debias": {"method": "learned_mixin", "prior": "token"}}))
    assert token.train.debias.prior == "token" and "prior" not in token.to_dict()["train"]["debias"]
    assert token.hash() == old.hash()
    sentence = build_config(old.to_dict(), ["train.debias.prior=sentence"])
    assert sentence.hash() != old.hash() and sentence.to_dict()["train"]["debias"]["prior"] == "sentence"
    again = build_config(sentence.to_dict())
    assert again.train.debias.prior == "sentence" and again.hash() == sentence.hash()
    # bias_term likewise: `log` is what every debias config meant before the key existed.
    log = build_config(old.to_dict(), ["train.debias.bias_term=log"])
    assert "bias_term" not in log.to_dict()["train"]["debias"] and log.hash() == old.hash()
    prob = build_config(old.to_dict(), ["train.debias.bias_term=probability"])
    assert prob.hash() != old.hash() and build_config(prob.to_dict()).train.debias.bias_term == "probability"


@pytest.mark.parametrize("overrides, message", [
    (["model.head=matrix", "train.debias.method=bias_product"], r"train.debias: head 'matrix' cannot"),
    (["train.debias.method=product"], "train.debias.method must be one of"),
    (["train.debias.method=learned_mixin_h"], "train.debias.entropy_weight must be set"),
    (["train.debias.method=learned_mixin", "train.debias.entropy_weight=1"], "train.debias.entropy_weight is read"),
    (["train.debias.method=bias_product", "train.debias.smoothing=0"], "train.debias.smoothing must be > 0"),
    (["train.debias.method=learned_mixin", "train.debias.gate=mean"], "train.debias.gate must be one of"),
    (["train.debias.method=entropy", "train.debias.gate=cls"], "train.debias.gate is read"),
    (["train.debias=yes"], "train.debias: expected a mapping"),
    (["train.debias.method=bias_product", "train.debias.prior=word"], r"train.debias.prior must be one of \['tok"),
    (["train.debias.method=learned_mixin", "train.debias.prior=3"], "train.debias.prior: expected str"),
    (["train.debias.method=entropy", "train.debias.prior=sentence"], "train.debias.prior is read by bias_product"),
    (["train.debias.method=bias_product", "train.debias.bias_term=exp"], r"train.debias.bias_term must be one of"),
    (["train.debias.method=entropy", "train.debias.bias_term=probability"], "train.debias.bias_term is read by"),
])
def test_bad_debias_settings_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config(tiny_config(), overrides)


def test_entropy_needs_embeddings_as_wide_as_the_hidden_states():
    encoder = SimpleNamespace(config=SimpleNamespace(hidden_size=32), get_input_embeddings=lambda: nn.Embedding(5, 16))
    with pytest.raises(ConfigError, match="train.debias.method entropy"):
        make_debias(DebiasConfig(method="entropy"), "independent", encoder)


# ------------------------------------------------------------------------------ predictions alone
@pytest.mark.parametrize("head", ["independent", "dynamic_query", "conditional_pointer"])
def test_scores_are_the_main_models_alone(tokenizer, feats, head):
    """The prior and the gate enter the loss only: with or without targets, and whatever the
    prior, the scores that decoding reads are the plain model's."""
    base = tiny_model(tokenizer, head=head).eval()
    batch, targets = batch_and_targets(feats)
    plain = base(batch)
    for method in ("bias_product", "learned_mixin"):
        model = debiased(base, method, peaked_prior(96, at=1)).eval()
        for out in (model(batch), model(batch, targets)):
            for key in ("start_logits", "end_logits"):
                assert torch.equal(out[key], plain[key]), (method, key)


@pytest.mark.parametrize("method, head, extra", [
    ("bias_product", "independent", {}),
    ("learned_mixin", "dynamic_query", {"gate": "max"}),
    ("learned_mixin_h", "conditional_pointer", {"entropy_weight": 0.5}),
    ("entropy", "independent", {}),
    ("bias_product", "independent", {"prior": "sentence"}),
    ("learned_mixin", "conditional_pointer", {"prior": "sentence"}),
    ("bias_product", "independent", {"prior": "sentence", "bias_term": "probability"}),
])
def test_train_then_evaluate_with_each_method(tmp_path, method, head, extra):
    d = tiny_config(tmp_path, model={"head": head}, data={"max_train_examples": 16, "max_eval_examples": 12},
                    train={"max_steps": 2, "debias": {"method": method, **extra}})
    cfg = build_config({**d, "perturb": [{"name": "random_padding"}]})  # works with position shifts
    summary = posbias.train(cfg, progress=False)
    run = tmp_path / "run"
    info = json.loads((run / "run_info.json").read_text(encoding="utf-8"))
    assert info["status"] == "finished" and info["debias"]["method"] == method
    meta = json.loads((run / "best" / "posbias_model.json").read_text(encoding="utf-8"))
    weights = load_file(str(run / "best" / "model.safetensors"))
    assert ("debias.gate.weight" in weights) == method.startswith("learned_mixin")
    # The gate is logged with the loss at every log step (tiny_config logs every step).
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    gates = [r.get("stats", {}).get("debias_gate_mean") for r in log]
    assert len(log) == 2 and all((g is not None and g > 0) == method.startswith("learned_mixin") for g in gates)
    assert not any(k.startswith("debias.log_prior") for k in weights)  # the prior is JSON, not a tensor
    evaluate = lambda out: posbias.evaluate(run / "best", DEMO_DEV, tmp_path / out,  # noqa: E731
                                            overrides=["data.max_eval_examples=12"], progress=False)
    first = evaluate("ev1")
    # The checkpoint evaluates as the in-training evaluation did (that model held the prior).
    assert first["f1"] == pytest.approx(summary["best_f1"])
    assert first["exact_match"] == pytest.approx(summary["eval"]["exact_match"])
    if method == "entropy":
        assert meta["debias"] == {"method": "entropy", "prior": None}
        return
    prior = AnswerPrior.from_dict(meta["debias"]["prior"])
    assert abs(prior.start.sum() + prior.null - 1) < 1e-9 and info["debias"]["prior"]["windows"] == prior.windows
    level = extra.get("prior", "token")
    assert prior.level == info["debias"]["prior"]["level"] == level
    assert info["debias"]["bias_term"] == extra.get("bias_term", "log")
    assert len(prior.start) == (SENTENCE_BUCKETS if level == "sentence" else 128)
    # Replace the saved prior by one that would move every prediction it entered: nothing changes.
    meta["debias"]["prior"] = peaked_prior(len(prior.start), at=len(prior.start) - 1, level=level).to_dict()
    (run / "best" / "posbias_model.json").write_text(json.dumps(meta), encoding="utf-8")
    second = evaluate("ev2")
    assert second["f1"] == first["f1"]
    for name in ("predictions.json", "nbest.json"):
        read = lambda folder: (tmp_path / folder / name).read_text(encoding="utf-8")  # noqa: E731
        assert read("ev1") == read("ev2")
