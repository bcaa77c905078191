"""Mixed precision (issue 30): under bf16 autocast only the encoder runs in low precision; every head's
scores, masks, softmaxes and losses come out fp32, NaN-free and close to the fp32 model's; masks stay
finite in bf16; decoding rounded logits keeps every top span the rounding cannot reorder;
`resolve_precision` / `autocast` / `full_precision`; the config keys and their hash neutrality.

Tolerances (bf16 keeps an 8-bit significand: unit roundoff u = 2**-8 = 0.0039 for round-to-nearest):
- Scores of a bf16-autocast forward against the fp32 forward of the same weights and batch, centered
  per row over unmasked positions (a softmax ignores the shift, and VCP's log-probabilities would
  otherwise be measured against their log-normaliser): max |bf16 - fp32| <= TOL * max |fp32|,
  TOL = 8u = 2**-5. Each encoder matmul rounds its inputs and output to bf16 (a few u per layer, 2
  layers, partly undone by the fp32 LayerNorms); measured on these tiny models it is at most 1.2e-4
  (0.03u) for every head, so TOL leaves a wide margin across CPUs, while another seed's scores (a head
  running on garbage) are 1.2-2.1 away, 40x over TOL (`test_the_score_tolerance_has_teeth`). An
  unconditioned argmax-agreement check is not used: these random heads have near-ties (margins below
  1e-4 of the scale) that bf16 legitimately flips; where the margin exceeds twice the score error, the
  decoded best span is checked instead. The same for fp16 with u = 2**-11 (8u = 2**-8).
- Decoding fixed logits rounded to bf16: each logit moves by at most u * max|logit|, a span score
  (start + end) by at most BOUND = 2u * max|logit|, so the k-th best score moves by at most BOUND
  (order statistics are 1-Lipschitz in the max norm) and the top-1 span cannot change where the fp32
  margin between the best and second-best span exceeds 2 * BOUND.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from posbias.config import RESOURCES, build_config
from posbias.errors import ConfigError
from posbias.qa.collate import collate
from posbias.qa.decode import batch_candidates
from posbias.qa.examples import Answer, QAExample
from posbias.qa.features import build_qa_features
from posbias.qa.model import build_model

from helpers import TINY_ENCODER, assert_close_to_scale, relative_error, tiny_config

BF16 = torch.bfloat16
U = 2.0 ** -8  # bf16 unit roundoff (8-bit significand, round to nearest)
TOL = 8 * U  # scores: relative to the fp32 tensor's scale (module docstring)
MASKED = torch.finfo(torch.float32).min / 2  # below this a head's score is a mask, not a score

# name -> (head, head options, position_embedding_type, attention implementation)
QA_CASES = {
    "independent": ("independent", {}, None, "sdpa"),
    "independent-softmax_all": ("independent", {"softmax_over": "all"}, None, "eager"),
    "vcp": ("conditional_pointer", {}, None, "sdpa"),
    "map-forward-sampled-row": ("matrix", {"direction": "forward", "training": "sampled", "k": 4}, None, "sdpa"),
    "map-backward-exact": ("matrix", {"direction": "backward", "training": "exact", "inference": "exact"},
                           None, "sdpa"),
    "map-both-ensemble-sampled-block": ("matrix", {"direction": "both", "ensemble": True, "training": "sampled",
                                                   "k": 4, "normalization": "block", "inference_k": 5}, None, "sdpa"),
    "map-both-F-sampled": ("matrix", {"direction": "both", "ensemble": False, "k": 3}, None, "eager"),
    "dyref-full": ("dynamic_query", {"attention": "full"}, None, "sdpa"),
    "dyref-bidirectional": ("dynamic_query", {"attention": "bidirectional", "query_pooling": "max"}, None, "eager"),
    "dyref-causal": ("dynamic_query", {"attention": "causal"}, None, "sdpa"),
    "dyref-causal-eager": ("dynamic_query", {"attention": "causal", "query_pooling": "last"}, None, "eager"),
    "dyref-independent": ("dynamic_query", {"attention": "independent", "softmax_over": "context"}, None, "sdpa"),
    "independent-relative_key": ("independent", {}, "relative_key", "sdpa"),
    "independent-relative_key-eager": ("independent", {}, "relative_key", "eager"),
    "vcp-relative_key_query": ("conditional_pointer", {}, "relative_key_query", "sdpa"),
    "map-relative_key_query-eager": ("matrix", {"direction": "forward", "k": 4}, "relative_key_query", "eager"),
    "dyref-causal-relative_key_query": ("dynamic_query", {"attention": "causal"}, "relative_key_query", "eager"),
    "dyref-independent-relative_key": ("dynamic_query", {"attention": "independent"}, "relative_key", "sdpa"),
}


def qa_model(tokenizer, case, seed=0):
    head, options, pe, attn = QA_CASES[case]
    torch.manual_seed(seed)
    model_section = {"head": head, "head_options": options}
    if pe:
        model_section["position_embedding_type"] = pe
    cfg = build_config(tiny_config(model=model_section))
    model = build_model(cfg.model, tokenizer, null_answer=False)
    model.encoder.set_attn_implementation(attn)
    return model


@pytest.fixture(scope="module")
def qa_batch(tokenizer, dev_examples):
    """(batch, targets): four windows of lengths 96, 62, 19 (a one-sentence context) and 96: two rows
    padded, one of them to five times its length."""
    short = QAExample("short", "Where did the cat sit?", "The cat sat on the mat.", [Answer("on the mat", 12)])
    feats = build_qa_features([short, *dev_examples[:8]], tokenizer, max_seq_len=96, stride=32,
                              max_query_len=24, train=True, version=1)
    lens = np.array([len(x) for x in feats.input_ids])
    order = np.argsort(lens, kind="stable")
    pick = [int(order[-1]), int(order[1]), int(order[0]), int(order[-2])]
    batch = collate(feats, pick, pad_id=tokenizer.pad_token_id, with_labels=True)
    real = batch["attention_mask"].sum(1)
    assert real[0] == batch["input_ids"].shape[1] and real[2] < 24 < real[1] < real[0]
    return batch, {k: batch[k] for k in ("start_positions", "end_positions")}


def floating(obj, path="out"):
    """(path, tensor) for every floating tensor in nested dicts / tuples / lists."""
    if isinstance(obj, torch.Tensor):
        return [(path, obj)] if obj.is_floating_point() else []
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in floating(v, f"{path}.{k}")]
    if isinstance(obj, (tuple, list)):
        return [x for i, v in enumerate(obj) for x in floating(v, f"{path}[{i}]")]
    return []


def score_tensors(out: dict) -> dict:
    """name -> (b, s) fp32 scores a head returns (masked positions at the dtype's minimum)."""
    if "start_logits" in out:
        return {"start": out["start_logits"], "end": out["end_logits"]}
    return {name: out[name]["first"] for name in ("forward", "backward") if name in out}


def run(model, batch, targets=None, bf16=False):
    ctx = torch.autocast("cpu", dtype=BF16) if bf16 else torch.autocast("cpu", enabled=False)
    with ctx:
        return model(batch, targets)


def assert_fp32_and_finite(out):
    tensors = floating(out)
    assert tensors
    for path, t in tensors:
        assert t.dtype == torch.float32, f"{path}: {t.dtype}"
        assert not torch.isnan(t).any(), f"{path}: NaN"
    if "loss" in out:
        assert torch.isfinite(out["loss"]), out["loss"]


def centered(x, keep):
    """x minus its row mean over `keep` (0 elsewhere): scores up to the shift a softmax ignores, so that
    log-probabilities (VCP) are compared at the scale of their spread, not of their log-normaliser."""
    mean = torch.where(keep, x, 0).sum(1, keepdim=True) / keep.sum(1, keepdim=True)
    return torch.where(keep, x - mean, 0)


def assert_scores_close(bf, fp, what):
    """The same positions masked; on the others, the centered scores within TOL of the fp32 scale; and
    not bit-identical (the encoder did run in bf16)."""
    keep = fp > MASKED
    assert torch.equal(bf > MASKED, keep), f"{what}: the bf16 run masks other positions"
    assert keep.any(1).all()
    assert_close_to_scale(centered(bf, keep)[keep], centered(fp, keep)[keep], TOL, what)
    assert relative_error(bf[keep], fp[keep]) > 0, f"{what}: bit-identical to fp32: the encoder did not run in bf16"


@pytest.mark.parametrize("case", list(QA_CASES))
def test_qa_heads_under_bf16_autocast_are_fp32_finite_and_close_to_fp32(tokenizer, qa_batch, case):
    """Eval mode, padded batch: only the encoder runs under autocast; every floating output (scores,
    MaP's states, the loss) is fp32 and NaN-free; scores and loss match the fp32 run's; decoding the
    bf16 scores moves the k best span scores by no more than the scores moved, and keeps the best span
    wherever the fp32 margin is wider than twice that."""
    batch, targets = qa_batch
    model = qa_model(tokenizer, case).eval()
    seen = {}
    model.encoder.register_forward_pre_hook(lambda m, a: seen.__setitem__("encoder", torch.is_autocast_enabled("cpu")))
    model.head.register_forward_pre_hook(lambda m, a: seen.__setitem__("head", torch.is_autocast_enabled("cpu")))
    with torch.no_grad():
        fp = run(model, batch, targets)
        bf = run(model, batch, targets, bf16=True)
    assert seen == {"encoder": True, "head": False}
    assert_fp32_and_finite(bf)
    for name, t in score_tensors(fp).items():
        assert_scores_close(score_tensors(bf)[name], t, f"{case} {name}")
    assert_close_to_scale(bf["loss"], fp["loss"], TOL, f"{case} loss")
    # Decoding (outside autocast, as evaluation does).
    kw = {"k": 5, "max_answer_len": 10}
    with torch.no_grad():
        f_sc, f_st, f_en, _ = batch_candidates(model.head, fp, batch, **kw)
        b_sc, b_st, b_en, _ = batch_candidates(model.head, bf, batch, **kw)
    assert np.isfinite(b_sc[:, 0]).all() and not np.isnan(b_sc).any()
    assert_close_to_scale(b_sc[:, 0], f_sc[:, 0], TOL, f"{case} best span score")
    if "start_logits" in fp:  # additive span scores: each moves by at most e = max|d start| + max|d end|
        keep = fp["start_logits"] > MASKED
        e = sum((bf[n] - fp[n])[keep].abs().max().item() for n in ("start_logits", "end_logits")) * (1 + 1e-5)
        assert np.abs(b_sc - f_sc)[np.isfinite(f_sc)].max() <= e
        sure = f_sc[:, 0] - f_sc[:, 1] > 2 * e
        assert sure.any()
        assert (b_st[sure, 0] == f_st[sure, 0]).all() and (b_en[sure, 0] == f_en[sure, 0]).all()


@pytest.mark.parametrize("case", list(QA_CASES))
def test_qa_training_step_under_bf16_autocast_gives_finite_gradients(tokenizer, qa_batch, case):
    """Train mode (dropout on) with targets: the loss is an fp32 scalar, finite and close to the fp32
    loss under the same dropout draws; backward gives finite gradients, nonzero in encoder and head."""
    batch, targets = qa_batch
    model = qa_model(tokenizer, case).train()
    torch.manual_seed(7)
    fp = run(model, batch, targets)
    torch.manual_seed(7)
    bf = run(model, batch, targets, bf16=True)
    assert_fp32_and_finite(bf)
    assert bf["loss"].dim() == 0
    assert_close_to_scale(bf["loss"].detach(), fp["loss"].detach(), TOL, f"{case} train loss")
    bf["loss"].backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    bad = [n for n, g in grads.items() if g is not None and not torch.isfinite(g).all()]
    assert not bad, bad
    assert all(g.dtype == torch.float32 for g in grads.values() if g is not None)
    for part in ("encoder.", "head."):
        assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if n.startswith(part)), part


@pytest.mark.parametrize("case", ["independent", "vcp", "map-both-ensemble-sampled-block", "dyref-causal"])
def test_heads_get_fp32_states_from_an_encoder_that_returns_bf16(tokenizer, qa_batch, case):
    """BERT's last op is a LayerNorm, which autocast runs in fp32; an encoder whose states come out in
    bf16 (no final fp32 op) must still hand the head fp32 states (`to_float`): fp32 scores and loss,
    close to the fp32 run's."""
    batch, targets = qa_batch
    model = qa_model(tokenizer, case).eval()
    with torch.no_grad():
        fp = run(model, batch, targets)
    if hasattr(model.head, "encode"):  # DyReF runs the encoder itself
        encode = model.head.encode
        model.head.encode = lambda *a: {k: v.to(BF16) for k, v in encode(*a).items()}
    else:
        inputs = model._inputs
        model._inputs = lambda encoder, b: inputs(encoder, b).to(BF16)
    got = []
    model.head.register_forward_pre_hook(lambda m, a: got.extend(t.dtype for _, t in floating(a[0])))
    with torch.no_grad():
        bf = run(model, batch, targets, bf16=True)
    assert got and set(got) == {torch.float32}
    assert_fp32_and_finite(bf)
    for name, t in score_tensors(fp).items():
        assert_scores_close(score_tensors(bf)[name], t, f"{case} {name}")
    assert_close_to_scale(bf["loss"], fp["loss"], TOL, f"{case} loss")


U16 = 2.0 ** -11  # fp16 unit roundoff (11-bit significand)


@pytest.mark.parametrize("case", list(QA_CASES))
def test_qa_heads_under_fp16_autocast_are_fp32_finite_and_close_to_fp32(tokenizer, qa_batch, case):
    """fp16 (`train.eval_precision: fp16`) on CPU: fp32 NaN-free outputs whose scores and loss are within
    8 fp16 roundoffs of the fp32 scale (the bf16 argument with u = 2**-11)."""
    batch, targets = qa_batch
    model = qa_model(tokenizer, case).eval()
    with torch.no_grad():
        fp = run(model, batch, targets)
        with torch.autocast("cpu", dtype=torch.float16):
            half = model(batch, targets)
    assert_fp32_and_finite(half)
    for name, t in score_tensors(fp).items():
        keep = t > MASKED
        h = score_tensors(half)[name]
        assert torch.equal(h > MASKED, keep)
        assert_close_to_scale(centered(h, keep)[keep], centered(t, keep)[keep], 8 * U16, f"{case} {name}")
    assert_close_to_scale(half["loss"], fp["loss"], 8 * U16, f"{case} loss")


def test_the_score_tolerance_has_teeth(tokenizer, qa_batch):
    """The comparison fails for scores that are not the same model's: another seed's fp32 scores are
    far outside TOL, so the closeness checks above would catch a head running on garbage."""
    batch, _ = qa_batch
    with torch.no_grad():
        a = qa_model(tokenizer, "independent", seed=0).eval()(batch)["start_logits"]
        b = qa_model(tokenizer, "independent", seed=1).eval()(batch)["start_logits"]
    keep = a > MASKED
    assert relative_error(centered(b, keep)[keep], centered(a, keep)[keep]) > 8 * TOL
    with pytest.raises(AssertionError, match="relative error"):
        assert_scores_close(b, a, "another seed")


# ------------------------------------------------------------------------------------------ tagging
TAGGING_ENCODERS = {"absolute": None, "relative_key": "relative_key", "relative_key_query": "relative_key_query"}


@pytest.fixture(scope="module")
def tagging_batch():
    from posbias.tagging.collate import collate as tag_collate
    from posbias.tagging.features import build_tagging_features
    from posbias.tagging.readers import read_tagging
    from posbias.tagging.inputs import tagging_tokenizer

    tok = tagging_tokenizer(str(RESOURCES / "tiny_tokenizer"))
    ds = read_tagging(str(RESOURCES / "tagging_demo" / "wnut-train.conll.gz"))
    examples = ds.examples[:40]
    tags = sorted({t for e in examples for t in e.tags})
    labels = ["O"] + [t for t in tags if t != "O"]
    feats = build_tagging_features(examples, tok, labels=labels, scheme="iob2", max_seq_len=64, stride=16)
    lens = np.array([len(x) for x in feats.input_ids])
    order = np.argsort(lens, kind="stable")
    pick = [int(order[-1]), int(order[0]), int(order[len(order) // 2]), int(order[-2])]
    batch = tag_collate(feats, pick, pad_id=tok.pad_token_id, with_labels=True)
    real = batch["attention_mask"].sum(1)
    assert real[1] < real[0] / 2  # a short row, padded to more than twice its length
    return tok, labels, batch


def tagger(tok, labels, pe, seed=0):
    from posbias.tagging.model import build_model as build_tagger

    torch.manual_seed(seed)
    model = {"name_or_path": None, "tokenizer": "tiny", "encoder": dict(TINY_ENCODER)}
    if pe:
        model["position_embedding_type"] = pe
    cfg = build_config({"task": "tagging", "model": model,
                        "data": {"train_file": "demo:wnut-train", "max_seq_len": 64, "stride": 16}})
    return build_tagger(cfg.model, tok, labels, "iob2")


@pytest.mark.parametrize("pe", list(TAGGING_ENCODERS))
def test_tagger_under_bf16_autocast_is_fp32_finite_and_close_to_fp32(tagging_batch, pe):
    """The tagger's logits and loss come out fp32 and NaN-free from a bf16 encoder, close to the fp32
    run (eval); in train mode the loss is finite and backward gives finite gradients."""
    tok, labels, batch = tagging_batch
    model = tagger(tok, labels, TAGGING_ENCODERS[pe]).eval()
    targets = {"labels": batch["labels"]}
    with torch.no_grad():
        fp = run(model, batch, targets)
        bf = run(model, batch, targets, bf16=True)
    assert_fp32_and_finite(bf)
    real = batch["attention_mask"].bool()
    assert_close_to_scale(bf["logits"][real], fp["logits"][real], TOL, f"tagger {pe} logits")
    assert relative_error(bf["logits"][real], fp["logits"][real]) > 0  # the encoder ran in bf16
    agree = (bf["logits"].argmax(-1) == fp["logits"].argmax(-1))[real].float().mean().item()
    assert agree >= 0.9, agree
    assert_close_to_scale(bf["loss"], fp["loss"], TOL, f"tagger {pe} loss")

    model.train()
    out = run(model, batch, targets, bf16=True)
    assert_fp32_and_finite(out)
    out["loss"].backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert model.classifier.weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())


# -------------------------------------------------------------------------------------------- masks
def test_mask_min_stays_finite_in_low_precision_where_float32_min_does_not():
    """float32's minimum becomes -inf in bf16 (why `mask_min` exists); mask_min stays finite in bf16
    (and in fp16 for fp16), and is still a mask: far below any score."""
    from posbias.precision import mask_min

    assert torch.tensor(torch.finfo(torch.float32).min).to(BF16).item() == -math.inf
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        m = torch.tensor(mask_min(dtype), dtype=dtype)
        assert torch.isfinite(m.to(BF16)) and m.to(BF16).item() <= -1e38, dtype
        assert m.to(torch.float32).item() == torch.finfo(BF16).min  # bf16's minimum, exactly
    m16 = torch.tensor(mask_min(torch.float16), dtype=torch.float16)
    assert torch.isfinite(m16) and torch.isfinite(m16.to(BF16)) and m16.item() == torch.finfo(torch.float16).min


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_over_rows_masked_with_mask_min_stays_finite_in_bf16(dtype):
    """All but one position masked: the softmax puts all mass there; every position masked (what a
    -inf mask turns into NaN): finite, no NaN."""
    from posbias.precision import mask_min

    scores = torch.randn(3, 7)
    keep = torch.zeros(3, 7, dtype=torch.bool)
    keep[0, 4] = keep[1, 0] = True  # row 2: nothing kept
    mask = torch.where(keep, 0.0, mask_min(dtype)).to(dtype)
    p = torch.softmax(scores.to(BF16) + mask.to(BF16), -1)
    assert torch.isfinite(p).all()
    assert p[0, 4] == 1 and p[1, 0] == 1 and p[:2].sum() == 2
    lp = torch.log_softmax((scores + mask.float()), -1)
    assert not torch.isnan(lp).any() and lp[0, 4] == 0
    # The float32 minimum, as autocast hands it to a bf16 softmax, gives NaN on the fully masked row.
    old = torch.where(keep, 0.0, torch.finfo(torch.float32).min).to(BF16)
    assert torch.isnan(torch.softmax(scores.to(BF16) + old, -1)[2]).all()


def test_additive_mask_of_a_boolean_mask_has_no_inf_in_bf16():
    """relative_position.additive_mask: a keep mask (2-D or 4-D boolean) becomes 0 / mask_min, finite
    whether built in fp32 and cast to bf16 or built in bf16, and still masks."""
    from posbias.relative_position import additive_mask

    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    for mask in (keep, keep.bool()[:, None, None, :].expand(3, 1, 5, 5)):
        for dtype in (torch.float32, BF16):
            out = additive_mask(mask, dtype)
            assert out.dtype == dtype and out.shape == (3, 1, 1 if mask.dim() == 2 else 5, 5)
            low = out.to(BF16)
            assert torch.isfinite(low).all(), (mask.dim(), dtype)
            assert (low[..., :][keep.bool()[:, None, None, :].expand_as(low)] == 0).all()
            assert (low[~keep.bool()[:, None, None, :].expand_as(low)] <= -1e38).all()
    # Scores plus the mask, softmaxed in bf16: no probability on masked keys, none NaN.
    p = torch.softmax(torch.randn(3, 1, 5, 5).to(BF16) + additive_mask(keep, torch.float32).to(BF16), -1)
    assert torch.isfinite(p).all() and (p[~keep.bool()[:, None, None, :].expand_as(p)] == 0).all()


def test_additive_mask_of_an_eager_float_mask_has_no_inf_in_bf16():
    """With attn_implementation 'eager', transformers hands relative attention a 0 / float32-min float
    mask; under bf16 autocast additive_mask casts it to the scores' dtype (bf16), where it must not
    become -inf (a fully masked row would softmax to NaN): it is clamped to `mask_min`."""
    from posbias.relative_position import additive_mask

    keep = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)[:, None, None, :]
    eager = torch.where(keep, 0.0, torch.finfo(torch.float32).min)  # (b, 1, 1, r), as transformers builds it
    out = additive_mask(eager, BF16)
    assert (out[~keep.expand_as(out)] <= -1e38).all()  # still a mask
    assert torch.isfinite(out).all()
    assert not torch.isnan(torch.softmax(torch.randn(2, 1, 1, 5).to(BF16) + out, -1)).any()


@pytest.mark.parametrize("kind", ["full", "bidirectional", "causal", "independent"])
def test_dyref_query_attention_mask_has_no_inf_in_bf16(kind):
    """DyReF's additive (b, 1, S, S) mask, built in fp32 (the embeddings' dtype under autocast) or in
    bf16, is finite in bf16 and still blocks its pairs; a softmax over it stays NaN-free."""
    from posbias.qa.heads.dynamic_query import query_attention_mask

    attn = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    for dtype in (torch.float32, BF16):
        m = query_attention_mask(attn, kind, dtype)
        assert m.dtype == dtype and m.shape == (2, 1, 8, 8)
        low = m.to(BF16)
        assert torch.isfinite(low).all(), (kind, dtype)
        assert (low[0, 0, :, 6:] <= -1e38).all()  # padding keys are masked
        if kind != "full":
            assert (low[:, 0, 2:, :2] <= -1e38).all()  # tokens do not see the queries
        p = torch.softmax(torch.randn(2, 1, 8, 8).to(BF16) + low, -1)
        assert not torch.isnan(p).any() and (p[0, 0, :, 6:] == 0).all()


# ----------------------------------------------------------------------------------------- decoding
def fixed_logits(b=64, s=40, seed=0, span=None):
    """(batch, {start_logits, end_logits}) of fixed random fp32 logits, masked as a head masks them
    (float32's minimum outside the context); every row has its own context span (or `span`)."""
    from posbias.qa.heads.span_scores import masked_logits

    g = torch.Generator().manual_seed(seed)
    if span is None:
        span = torch.zeros(b, s, dtype=torch.bool)
        for r in range(b):
            lo = int(torch.randint(2, 12, (1,), generator=g))
            hi = int(torch.randint(lo + 5, s + 1, (1,), generator=g))
            span[r, lo:hi] = True
    start, end = (4 * torch.randn(b, s, generator=g) for _ in range(2))
    batch = {"span_mask": span, "max_context": span, "cls_index": torch.zeros(b, dtype=torch.long),
             "pad_left": torch.zeros(b, dtype=torch.long)}
    return batch, {"start_logits": masked_logits(start, span), "end_logits": masked_logits(end, span)}


def decode_both(head, batch, scores, k=10, max_answer_len=8):
    rounded = {n: t.to(BF16).float() for n, t in scores.items()}
    return (batch_candidates(head, scores, batch, k=k, max_answer_len=max_answer_len),
            batch_candidates(head, rounded, batch, k=k, max_answer_len=max_answer_len), rounded)


@pytest.mark.parametrize("path", ["additive", "band"])
def test_decoding_bf16_rounded_logits_keeps_every_span_the_rounding_cannot_reorder(path):
    """Top-1 agrees wherever the fp32 margin exceeds 2 * BOUND; the k best scores move by <= BOUND
    (BOUND = 2u max|logit|: module docstring). `additive`: the heads' fast path (top_spans_additive);
    `band`: the generic (b, L, s) band of span scores (top_spans)."""
    from posbias.qa.heads.independent import IndependentHead
    from posbias.qa.heads.span_scores import top_spans

    head = IndependentHead(8)
    if path == "band":
        class BandOnly:  # a head without the fast path: decoding builds the band
            null_answer = False
            span_scores = head.span_scores
        head = BandOnly()
    batch, scores = fixed_logits()
    (f_sc, f_st, f_en, _), (b_sc, b_st, b_en, _), rounded = decode_both(head, batch, scores)
    real = batch["span_mask"]
    top = max(scores["start_logits"][real].abs().max().item(), scores["end_logits"][real].abs().max().item())
    bound = 2 * U * top * (1 + 1e-6)  # + the fp32 additions' own rounding
    assert 0 < (rounded["start_logits"] - scores["start_logits"])[real].abs().max() <= U * top  # rounding happened
    assert np.isfinite(f_sc).all() and np.isfinite(b_sc).all()  # every row has >= k spans
    assert np.abs(b_sc - f_sc).max() <= bound
    margin = f_sc[:, 0] - f_sc[:, 1]
    sure = margin > 2 * bound
    assert sure.sum() >= len(sure) // 4, f"only {sure.sum()} rows with a clear winner: the check would be empty"
    assert (b_st[sure, 0] == f_st[sure, 0]).all() and (b_en[sure, 0] == f_en[sure, 0]).all()
    # Spans stay in the context, with start <= end < start + max_answer_len.
    rows = np.arange(len(b_st))[:, None].repeat(b_st.shape[1], 1)
    assert real.numpy()[rows, b_st].all() and real.numpy()[rows, b_en].all()
    assert ((b_en - b_st) >= 0).all() and ((b_en - b_st) < 8).all()
    if path == "band":  # the band path's scores are exactly those of a full band
        band = head.span_scores(scores, 8)
        sc, _, _ = top_spans(band, real, real, 10)
        np.testing.assert_array_equal(sc.numpy(), f_sc)


def test_decoding_rows_masked_but_one_position_gives_no_nan():
    """Rows whose context is one token: fp32 and bf16-rounded logits (the masked ones then -inf) both
    decode that single span, finite, the rest -inf / -1, never NaN."""
    from posbias.qa.heads.independent import IndependentHead

    one = torch.zeros(6, 20, dtype=torch.bool)
    where = torch.tensor([0, 5, 19, 7, 12, 3])
    one[torch.arange(6), where] = True
    batch, scores = fixed_logits(b=6, s=20, seed=3, span=one)
    for (sc, st, en, null) in decode_both(IndependentHead(8), batch, scores, k=5)[:2]:
        assert not np.isnan(sc).any()
        assert np.isfinite(sc[:, 0]).all() and np.isneginf(sc[:, 1:]).all()
        assert (st[:, 0] == where.numpy()).all() and (en[:, 0] == where.numpy()).all()
        assert (st[:, 1:] == -1).all() and (en[:, 1:] == -1).all()
    # A head's loss on such rows (gold = the one candidate) is ~0 and finite in fp32.
    lp = torch.log_softmax(scores["start_logits"], -1)
    assert not torch.isnan(lp).any() and lp[torch.arange(6), where].abs().max() < 1e-6


# ---------------------------------------------------------------------------------------- precision
def test_resolve_precision_fixed_values():
    """fp32 / no -> fp32 (accelerate's `no`); bf16 -> bf16; fp16 -> fp16 with the CPU caveat."""
    from posbias.precision import resolve_precision

    cpu = torch.device("cpu")
    for spec in ("fp32", "no"):
        p = resolve_precision(spec, cpu)
        assert (p.name, p.requested, p.accelerate, p.dtype) == ("fp32", spec, "no", torch.float32)
    p = resolve_precision("bf16", cpu)
    assert (p.name, p.requested, p.accelerate, p.dtype) == ("bf16", "bf16", "bf16", BF16)
    assert p.reason.startswith("asked for")
    p = resolve_precision("fp16", cpu)
    assert (p.name, p.dtype) == ("fp16", torch.float16) and "CPU" in p.reason
    assert p.to_dict() == {"precision": "fp16", "requested": "fp16", "reason": p.reason}


@pytest.mark.parametrize("native, name", [(True, "bf16"), (False, "fp32")])
def test_resolve_precision_auto_follows_native_bf16(monkeypatch, native, name):
    """`auto` picks bf16 exactly where native_bf16 says the device computes it natively, and records why."""
    from posbias import precision

    why = "x" if native else "y"
    asked = []
    monkeypatch.setattr(precision, "native_bf16", lambda device: (asked.append(device) or (native, why)))
    p = precision.resolve_precision("auto", torch.device("cpu"))
    assert (p.name, p.requested) == (name, "auto") and why in p.reason and p.reason.startswith("auto")
    assert asked == [torch.device("cpu")]
    assert precision.resolve_precision("bf16", torch.device("cpu")).name == "bf16"  # asked for: whatever the CPU


def test_native_bf16_on_this_cpu_gives_a_reason():
    from posbias.precision import native_bf16

    ok, why = native_bf16(torch.device("cpu"))
    assert isinstance(ok, bool) and why and ("AMX" in why or "AVX512" in why)


@pytest.mark.parametrize("bad", ["bfloat16", "half", "FP32", "", "fp8"])
def test_resolve_precision_refuses_other_values_naming_the_key(bad):
    from posbias.precision import resolve_precision

    with pytest.raises(ConfigError, match=r"train\.mixed_precision") as e:
        resolve_precision(bad, torch.device("cpu"), "train.mixed_precision")
    assert repr(bad) in str(e.value)
    with pytest.raises(ConfigError, match=r"train\.eval_precision"):
        resolve_precision(bad, torch.device("cpu"))


def test_autocast_context_is_a_no_op_for_fp32_and_enables_bf16():
    from posbias.precision import autocast, resolve_precision

    cpu = torch.device("cpu")
    with autocast(cpu, resolve_precision("fp32", cpu)):
        assert not torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with autocast(cpu, resolve_precision("bf16", cpu)):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == BF16
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == BF16
    assert not torch.is_autocast_enabled("cpu")


def test_full_precision_leaves_autocast_inside_an_autocast_block():
    from posbias.precision import full_precision

    x = torch.ones(2, 2)
    with torch.autocast("cpu", dtype=BF16):
        with full_precision(x):
            assert not torch.is_autocast_enabled("cpu")
            assert (x @ x).dtype == torch.float32
        assert torch.is_autocast_enabled("cpu") and (x @ x).dtype == BF16  # restored after
        with full_precision(None, "not a tensor", x):  # the first tensor decides
            assert not torch.is_autocast_enabled("cpu")
    with full_precision(x):  # outside autocast: nothing to leave
        assert not torch.is_autocast_enabled("cpu")


def test_to_float_casts_only_low_precision_floats_in_nested_containers():
    from collections import namedtuple

    from posbias.precision import to_float

    Pair = namedtuple("Pair", "a b")
    obj = {"h": torch.ones(2, dtype=BF16),
           "x": [torch.ones(1, dtype=torch.float16), (torch.ones(1, dtype=torch.float64),)],
           "p": Pair(torch.ones(1, dtype=BF16), torch.ones(1, dtype=torch.long)), "n": 3}
    out = to_float(obj)
    assert out["h"].dtype == torch.float32 and out["x"][0].dtype == torch.float32
    assert out["x"][1][0].dtype == torch.float64 and isinstance(out["x"][1], tuple)
    assert isinstance(out["p"], Pair) and out["p"].a.dtype == torch.float32 and out["p"].b.dtype == torch.long
    assert out["n"] == 3
    same = torch.ones(3)
    assert to_float(same) is same  # fp32 is passed through, not copied


# ------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("value", ["fp32", "bf16", "fp16", "auto"])
def test_eval_precision_accepts_its_values(value):
    assert build_config(tiny_config(train={"eval_precision": value})).train.eval_precision == value


@pytest.mark.parametrize("value", ["no", "bfloat16", "half", "fp64", "FP32"])
def test_eval_precision_refuses_other_values_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"train\.eval_precision"):
        build_config(tiny_config(train={"eval_precision": value}))


def test_mixed_precision_accepts_auto_and_refuses_other_words():
    for value in ("no", "bf16", "fp16", "auto"):
        assert build_config(tiny_config(train={"mixed_precision": value})).train.mixed_precision == value
    with pytest.raises(ConfigError, match=r"train\.mixed_precision"):
        build_config(tiny_config(train={"mixed_precision": "bfloat16"}))


def test_eval_precision_is_hash_neutral_at_fp32_only():
    """Runs recorded before the key existed keep their hashes: at fp32 the key is left out of the
    hashed dict (the hash equals that of the dict without it, as `test_config` computes it); bf16,
    fp16 and auto change the hash. Tagging configs share the train section."""
    import hashlib
    import json

    first = build_config(tiny_config())
    assert first.train.eval_precision == "fp32"
    d = first.to_dict()
    del d["train"]["eval_precision"]
    del d["data"]["train_subset"]  # as in test_config: the other keys at neutral defaults
    del d["config_version"]
    for key in ("output_dir", "device", "report_to", "early_stopping_patience", "eval_batch_tokens", "deterministic"):
        d["train"].pop(key, None)
    d["model"].pop("softmax_over_default")
    d["model"].pop("reinit_positions_from")  # a later key, left out at its default
    d["data"].pop("perturb_default_mode")
    d["data"]["doc_stride"] = d["data"].pop("stride")  # as in test_config: QA's hash keeps the old name
    assert first.hash() == hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
    assert build_config(tiny_config(train={"eval_precision": "fp32"})).hash() == first.hash()
    others = {v: build_config(tiny_config(train={"eval_precision": v})).hash() for v in ("bf16", "fp16", "auto")}
    assert first.hash() not in others.values() and len(set(others.values())) == 3
    tag = {"task": "tagging", "model": {"name_or_path": None, "tokenizer": "tiny", "encoder": dict(TINY_ENCODER)},
           "data": {"train_file": "demo:wnut-train"}}
    t32 = build_config(tag).hash()
    assert build_config({**tag, "train": {"eval_precision": "fp32"}}).hash() == t32
    assert build_config({**tag, "train": {"eval_precision": "bf16"}}).hash() != t32
