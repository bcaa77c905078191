"""Vectorised decoding equals the classic per-candidate loop on random logits."""
import math

import numpy as np
import pytest
import torch

from posbias.qa.collate import collate
from posbias.qa.features import build_qa_features
from posbias.qa.decode import WindowCandidates, batch_candidates, decode
from posbias.qa.heads.independent import IndependentHead
from posbias.qa.heads.span_scores import (band, band_from_matrix, candidate_mask, masked_logits, top_spans,
                                       top_spans_additive)


def reference_decode(examples, feats, start, end, *, n_best, max_answer_len, version, null_threshold=0.0):
    """The classic loop: every (start, end) pair of every window, each rejected for a stated reason."""
    preds, nbest, odds = {}, {}, {}
    for ei, ex in enumerate(examples):
        cands, null = [], math.inf
        for w in np.flatnonzero(feats.example_index == ei):
            s_log, e_log, off = start[w], end[w], feats.offsets[w]
            if version == 2:
                c = feats.cls_index[w]
                null = min(null, float(np.float32(s_log[c]) + np.float32(e_log[c])))
            for i in range(len(s_log)):
                for j in range(len(e_log)):
                    if off[i, 0] < 0 or off[j, 0] < 0:
                        continue  # start or end outside the context
                    if j < i:
                        continue  # end before start
                    if j - i + 1 > max_answer_len:
                        continue  # too long
                    score = float(np.float32(s_log[i]) + np.float32(e_log[j]))
                    cands.append({"text": ex.context[off[i, 0]:off[j, 1]], "score": score})
        cands.sort(key=lambda c: -c["score"])
        cands = cands[:n_best]
        best = cands[0] if cands else None
        if version == 2:
            cands = sorted(cands + [{"text": "", "score": null}], key=lambda c: -c["score"])[:n_best]
        z = np.exp(np.array([c["score"] for c in cands]) - max(c["score"] for c in cands))
        for c, p in zip(cands, z / z.sum()):
            c["probability"] = p
        nbest[ex.id] = cands
        if version == 2:
            odds[ex.id] = null - best["score"]
            preds[ex.id] = "" if odds[ex.id] > null_threshold else best["text"]
        else:
            preds[ex.id] = best["text"]
    return preds, nbest, odds


def vectorised_decode(examples, feats, start, end, *, n_best, max_answer_len, version, padding_side,
                      null_threshold=0.0, batch_size=7):
    head = IndependentHead(8, null_answer=version == 2)
    cands = WindowCandidates.empty(len(feats), n_best)
    for b in range(0, len(feats), batch_size):
        idx = np.arange(b, min(b + batch_size, len(feats)))
        batch = collate(feats, idx, pad_id=0, padding_side=padding_side)
        s = batch["input_ids"].shape[1]
        st = torch.full((len(idx), s), -1e4)
        en = torch.full((len(idx), s), -1e4)
        for r, w in enumerate(idx):
            p = int(batch["pad_left"][r])
            st[r, p:p + len(start[w])] = torch.from_numpy(start[w])
            en[r, p:p + len(end[w])] = torch.from_numpy(end[w])
        mask = candidate_mask(batch["span_mask"], batch["cls_index"], version == 2)
        scores = {"start_logits": masked_logits(st, mask), "end_logits": masked_logits(en, mask)}
        cands.fill(idx, *batch_candidates(head, scores, batch, k=n_best, max_answer_len=max_answer_len))
    return decode(examples, feats, cands, n_best=n_best, version=version, null_threshold=null_threshold)


@pytest.mark.parametrize("version, padding_side, max_answer_len, n_best", [
    (1, "right", 30, 20), (1, "left", 5, 7), (2, "right", 12, 10), (2, "left", 30, 3)])
def test_vectorised_equals_reference_loop(tokenizer, dev_examples, version, padding_side, max_answer_len, n_best):
    examples = dev_examples[:25]
    feats = build_qa_features(examples, tokenizer, max_seq_len=72, stride=24, max_query_len=24)
    rng = np.random.default_rng(version * 10 + n_best)
    start = [rng.normal(size=len(x)).astype(np.float32) * 3 for x in feats.input_ids]
    end = [rng.normal(size=len(x)).astype(np.float32) * 3 for x in feats.input_ids]
    for w in np.flatnonzero(feats.example_index % 2 == 0):  # make half the questions prefer null
        start[w][feats.cls_index[w]] = end[w][feats.cls_index[w]] = 20.0
    kw = dict(n_best=n_best, max_answer_len=max_answer_len, version=version)
    ref = reference_decode(examples, feats, start, end, **kw)
    vec = vectorised_decode(examples, feats, start, end, padding_side=padding_side, **kw)
    assert vec[0] == ref[0]
    for e in examples:
        got, want = vec[1][e.id], ref[1][e.id]
        assert [c["text"] for c in got] == [c["text"] for c in want]
        # Both sides add the same two float32 logits (a correctly rounded IEEE operation on every
        # CPU), so scores agree bit for bit; the tolerances only absorb float64 softmax rounding.
        np.testing.assert_allclose([c["score"] for c in got], [c["score"] for c in want], rtol=1e-6)
        np.testing.assert_allclose([c["probability"] for c in got], [c["probability"] for c in want], rtol=1e-5)
        if version == 2:
            assert vec[2][e.id] == pytest.approx(ref[2][e.id], rel=1e-5, abs=1e-5)
    if version == 2:
        # Some answers are null, some are not: the threshold branch is exercised both ways.
        assert 0 < sum(p == "" for p in vec[0].values()) < len(examples)


def test_null_threshold_moves_answers_to_null(tokenizer, dev_examples):
    examples = dev_examples[:25]
    feats = build_qa_features(examples, tokenizer, max_seq_len=72, stride=24, max_query_len=24)
    rng = np.random.default_rng(0)
    start = [rng.normal(size=len(x)).astype(np.float32) for x in feats.input_ids]
    end = [rng.normal(size=len(x)).astype(np.float32) for x in feats.input_ids]
    kw = dict(n_best=5, max_answer_len=10, version=2, padding_side="right")
    lo = vectorised_decode(examples, feats, start, end, null_threshold=-100.0, **kw)[0]
    hi = vectorised_decode(examples, feats, start, end, null_threshold=100.0, **kw)[0]
    assert all(p == "" for p in lo.values()) and all(p != "" for p in hi.values())


def test_top_spans_band_and_masks():
    m = torch.arange(16, dtype=torch.float32).reshape(1, 4, 4)  # score(i, j) = 4i + j
    ok = torch.tensor([[True, True, True, False]])
    sc, st, en = top_spans(band_from_matrix(m, 2), ok, ok, k=5)
    # valid: (0,0) (0,1) (1,1) (1,2) (2,2); best first
    assert list(zip(st[0].tolist(), en[0].tolist())) == [(2, 2), (1, 2), (1, 1), (0, 1), (0, 0)]
    assert sc[0].tolist() == [10, 6, 5, 1, 0]
    sc, st, en = top_spans(band_from_matrix(m, 1), ok, ok, k=5)
    assert st[0].tolist() == [2, 1, 0, -1] and torch.isinf(sc[0, 3:]).all()  # k capped at s*L = 4


def test_band_equals_matrix_band():
    torch.manual_seed(0)
    start, end = torch.randn(3, 9), torch.randn(3, 9)
    head = IndependentHead(4)
    got = head.span_scores({"start_logits": start, "end_logits": end}, 4)
    want = band_from_matrix(start[:, :, None] + end[:, None, :], 4)
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite])
    assert (got[~finite] < -1e30).all()  # past the end of the sequence: never a candidate
    assert band(torch.arange(5.0)[None], 3, -1.0)[0, :, 3].tolist() == [3.0, 4.0, -1.0]


def test_top_spans_rejects_bad_ranks():
    with pytest.raises(ValueError, match="span_band"):
        top_spans(torch.zeros(4, 4), torch.ones(1, 4, dtype=bool), torch.ones(1, 4, dtype=bool), 2)
    with pytest.raises(ValueError, match="start_ok"):
        top_spans(torch.zeros(1, 3, 4), torch.ones(1, 3, dtype=bool), torch.ones(1, 4, dtype=bool), 2)


@pytest.mark.parametrize("seed", range(5))
def test_additive_fast_path_equals_band_top_k(seed):
    g = torch.Generator().manual_seed(seed)
    b, s, L, k = 6, 40, 7, 12
    start, end = torch.randn(b, s, generator=g), torch.randn(b, s, generator=g)
    start_ok = torch.rand(b, s, generator=g) > 0.3
    end_ok = torch.rand(b, s, generator=g) > 0.3
    start_ok[0] = False  # a row without any valid span
    start_ok[1, :] = False
    start_ok[1, 5] = end_ok[1, 5] = True  # a row with one start
    fast = top_spans_additive(start, end, start_ok, end_ok, L, k)
    slow = top_spans(start[:, None, :] + band(end, L, float("-inf")), start_ok, end_ok, k)
    for f, w in zip(fast, slow):
        torch.testing.assert_close(f, w)
    assert (fast[1][0] == -1).all() and set(fast[1][1].tolist()) == {5, -1}
