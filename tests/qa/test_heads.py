"""Span heads of the MaP paper: VCP (`conditional_pointer`) and MaP (`matrix`) against their
equations, the sampled training's block, the ensemble merge, and train -> save -> reload -> evaluate."""
import json

import numpy as np
import pytest
import torch

import posbias
from posbias.config import build_config
from posbias.errors import ConfigError
from posbias.qa.collate import collate
from posbias.qa.features import build_qa_features
from posbias.qa.heads import matrix as matrix_mod
from posbias.qa.heads.matrix import MatrixHead, _top_but_gold, ensemble_merge
from posbias.qa.heads.span_scores import top_spans
from posbias.qa.model import build_model

from helpers import tiny_config, train_and_reevaluate

HEAD_OPTIONS = {
    "conditional_pointer": {},
    "matrix_forward": {"direction": "forward"},
    "matrix_backward": {"direction": "backward"},
    "matrix_ensemble": {"direction": "both", "ensemble": True},
    "dynamic_query": {"query_pooling": "max", "attention": "causal"},
}


def head_model(tokenizer, head, options=None, seed=0, null_answer=False):
    torch.manual_seed(seed)
    cfg = build_config(tiny_config(model={"head": head, "head_options": options or {}}))
    return build_model(cfg.model, tokenizer, null_answer=null_answer)


@pytest.fixture(scope="module")
def feats(tokenizer, dev_examples):
    return build_qa_features(dev_examples[:12], tokenizer, max_seq_len=96, stride=32, max_query_len=24,
                             train=True, version=1)


def batch_of(feats, n=6):
    batch = collate(feats, np.arange(n), pad_id=0, with_labels=True)
    return batch, {k: batch[k] for k in ("start_positions", "end_positions")}


def test_question_mask_marks_question_tokens_only(tokenizer, feats):
    batch, _ = batch_of(feats, 3)
    ids, q = batch["input_ids"][0], batch["question_mask"][0]
    assert q.any() and not (q & batch["span_mask"][0]).any()
    assert not q[batch["cls_index"][0]] and not (q & (ids == tokenizer.sep_token_id)).any()
    first_sep = int((ids == tokenizer.sep_token_id).nonzero()[0])
    assert q[1:first_sep].all() and not q[first_sep:].any()  # [CLS] question [SEP] context [SEP]


@pytest.mark.parametrize("name", ["conditional_pointer", "matrix_forward", "matrix_ensemble"])
def test_shapes_masking_and_gradients(tokenizer, feats, name):
    head = "conditional_pointer" if name == "conditional_pointer" else "matrix"
    model = head_model(tokenizer, head, HEAD_OPTIONS[name])
    batch, targets = batch_of(feats)
    out = model(batch, targets)
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    grads = {n: p.grad for n, p in model.head.named_parameters()}
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads.values()), \
        [n for n, g in grads.items() if g is None or g.abs().sum() == 0]
    with torch.no_grad():
        sc, st, en = model.head.top_spans(model(batch), batch["span_mask"], batch["span_mask"], 10, 5)
    assert sc.shape == (6, 5)
    ok = st >= 0
    assert ok.any(1).all()
    rows = torch.arange(6)[:, None].expand_as(st)
    # Every decoded span lies in the context, ends after it starts, within max_answer_len.
    assert batch["span_mask"][rows[ok], st[ok]].all() and batch["span_mask"][rows[ok], en[ok]].all()
    assert ((en - st)[ok] >= 0).all() and ((en - st)[ok] < 10).all()
    # Scores are log-probabilities of spans: at most 0, and sorted.
    assert (sc[ok] <= 1e-6).all() and (sc[:, :-1] >= sc[:, 1:]).all()


def test_vcp_start_distribution_ignores_question_and_padding(tokenizer, feats):
    model = head_model(tokenizer, "conditional_pointer").eval()
    batch, _ = batch_of(feats)
    with torch.no_grad():
        out = model(batch)
    assert (out["start_logits"][~batch["span_mask"]] <= torch.finfo(torch.float32).min / 2).all()
    torch.testing.assert_close(out["start_logits"].exp().sum(-1), torch.ones(6))
    torch.testing.assert_close(out["end_logits"].exp().sum(-1), torch.ones(6))


def test_vcp_equations_on_a_constructed_case():
    """Eq. 2-6 written out by hand for one example."""
    from posbias.qa.heads.pointer import ConditionalPointerHead

    torch.manual_seed(0)
    head = ConditionalPointerHead(8, width=5).double()
    h = torch.randn(1, 7, 8, dtype=torch.float64)
    batch = {"span_mask": torch.tensor([[0, 0, 0, 1, 1, 1, 0]], dtype=torch.bool),
             "question_mask": torch.tensor([[0, 1, 1, 0, 0, 0, 0]], dtype=torch.bool),
             "cls_index": torch.tensor([0]), "attention_mask": torch.ones(1, 7)}
    out = head(h, batch)
    H, HQ = h[0], h[0, 1:3]
    p_init = torch.softmax(head.pool.v.weight @ torch.tanh(head.pool.proj.weight @ HQ.T), -1)[0]  # Eq. 5
    h_s = HQ.T @ p_init  # Eq. 6
    V, W, v = head.pointer.proj.weight, head.pointer.state.weight, head.pointer.v.weight[0]

    def pointer(state):  # Eq. 4 over the context tokens 3..5
        return torch.log_softmax(v @ torch.tanh(V @ H[3:6].T + (W @ state)[:, None]), -1)

    log_ps = pointer(h_s)
    c_e = H[3:6].T @ log_ps.exp()  # Eq. 3
    h_e = head.rnn(c_e[None], h_s[None])[0]  # Eq. 2
    torch.testing.assert_close(out["start_logits"][0, 3:6], log_ps)
    torch.testing.assert_close(out["end_logits"][0, 3:6], pointer(h_e))


def test_question_pooling_scores_only_the_question_columns_and_equals_the_full_formula():
    """Eq. 5-6 over the whole window (masked) and over the batch's question columns give the same h_s."""
    from posbias.qa.heads.pointer import QuestionPooling

    torch.manual_seed(3)
    pool = QuestionPooling(6, 4).double()
    h = torch.randn(3, 10, 6, dtype=torch.float64)
    q = torch.zeros(3, 10, dtype=torch.bool)
    q[0, 1:3], q[1, 2:6], q[2, 7:9] = True, True, True  # different spans per example (context first in row 2)
    logits = pool.v(torch.tanh(pool.proj(h))).squeeze(-1).masked_fill(~q, float("-inf"))
    expect = torch.einsum("bs,bsd->bd", logits.softmax(-1), h)
    torch.testing.assert_close(pool(h, q), expect, rtol=1e-12, atol=1e-12)


def test_chunked_matrix_scores_equal_the_concatenation_formula(monkeypatch):
    """Eq. 7 as written, vᵀ tanh(V [H_j ; H_i]) with V = [V₁ V₂], against the chunked rows."""
    torch.manual_seed(1)
    scorer = matrix_mod.PairScorer(6, 4).double()
    h = torch.randn(2, 9, 6, dtype=torch.float64)
    V = torch.cat([scorer.col.weight, scorer.row.weight], dim=1)  # (l, 2d)
    cat = torch.cat([h[:, None, :, :].expand(2, 9, 9, 6), h[:, :, None, :].expand(2, 9, 9, 6)], -1)  # [b,i,j]=[H_j;H_i]
    naive = (torch.tanh(cat @ V.T) @ scorer.v.weight[0])  # (b, i, j)
    monkeypatch.setattr(matrix_mod, "CHUNK_ELEMENTS", 2 * 9 * 4 * 2)  # with gradient: two rows per chunk
    monkeypatch.setattr(matrix_mod, "CACHE_ELEMENTS", 9 * 4 * 3)  # without: three rows per chunk
    a = scorer.project(h)
    rows = torch.arange(9).expand(2, 9)
    torch.testing.assert_close(scorer.rows(a, h, rows), naive, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(scorer.rows(a, h, rows), naive, rtol=1e-12, atol=1e-12)
        cols = torch.rand(2, 9) > 0.4  # only candidate columns are computed, the others are -inf
        some = scorer.rows(a, h, rows[:, [5, 2]], cols)
        torch.testing.assert_close(some, naive[:, [5, 2]].masked_fill(~cols[:, None], float("-inf")),
                                   rtol=1e-12, atol=1e-12)
    # Gradients through the checkpointed chunks equal those of the naive formula.
    h.requires_grad_(True)
    a = scorer.project(h)
    g1 = torch.autograd.grad(scorer.rows(a, h, rows).square().sum(), h)[0]
    cat = torch.cat([h[:, None, :, :].expand(2, 9, 9, 6), h[:, :, None, :].expand(2, 9, 9, 6)], -1)
    g2 = torch.autograd.grad((torch.tanh(cat @ V.T) @ scorer.v.weight[0]).square().sum(), h)[0]
    torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-12)
    # A sampled block is the same entries.
    r = torch.tensor([[4, 0], [8, 3]])
    c = torch.tensor([[[1, 2, 8], [0, 0, 5]], [[7, 3, 3], [6, 1, 0]]])
    block = scorer.pairs(a, h, r, c)
    expect = naive[torch.arange(2)[:, None, None], r[:, :, None], c]
    torch.testing.assert_close(block, expect, rtol=1e-12, atol=1e-12)


def _rows_per_example(scorer, a, hidden, rows, cols=None, cache_elements=matrix_mod.CACHE_ELEMENTS):
    """The no-grad `PairScorer.rows` before it was batched: one example at a time, its candidate
    columns found with `nonzero` (a host read per example on a GPU). The reference of the test below."""
    n, s, width = a.shape
    b_rows = scorer.project_rows(hidden, rows)
    v = scorer.v.weight[0]
    out = a.new_full((n, rows.shape[1], s), float("-inf"))
    for i in range(n):
        idx = cols[i].nonzero().squeeze(1) if cols is not None else None
        a_i = a[i] if idx is None else a[i, idx]
        step = max(1, cache_elements // max(1, a_i.shape[0] * width))
        for c in range(0, rows.shape[1], step):
            z = torch.tanh(a_i[None] + b_rows[i, c:c + step, None]) @ v
            if idx is None:
                out[i, c:c + step] = z
            else:
                out[i, c:c + step, idx] = z
    return out


def _no_host_reads(monkeypatch, *modules):
    """Pretend the tensors are on a GPU (`reads_wait`) and fail on any `nonzero`, the host read."""
    for m in modules:
        monkeypatch.setattr(m, "reads_wait", lambda t: True, raising=False)  # raising: the code before the seam

    def nonzero(*args, **kwargs):
        raise AssertionError("nonzero: a host read per forward on a GPU")

    monkeypatch.setattr(torch.Tensor, "nonzero", nonzero)
    monkeypatch.setattr(torch, "nonzero", nonzero)


@pytest.mark.parametrize("gpu_like", [False, True], ids=["cpu", "gpu-like"])
@pytest.mark.parametrize("budget", [None, 5 * 8, 7 * 40 * 8], ids=["default", "one-row", "rows-of-examples"])
def test_batched_no_grad_rows_equal_the_per_example_loop(monkeypatch, gpu_like, budget):
    """The no-grad matrix rows (MaP inference, the sampled loss's column choice), computed in blocks
    of the whole batch, equal the old per-example loop on random inputs, with and without a
    candidate mask, for any block size; and on a GPU they need no `nonzero`."""
    from posbias.qa.heads import pointer as pointer_mod

    torch.manual_seed(11)
    scorer = matrix_mod.PairScorer(12, 8)
    h = torch.randn(5, 40, 12)
    a = scorer.project(h)
    rows = torch.randint(0, 40, (5, 7))
    cols = torch.rand(5, 40) > 0.3
    cols[3] = False  # an example without candidates: a row of -inf
    with torch.no_grad():
        want = [_rows_per_example(scorer, a, h, rows), _rows_per_example(scorer, a, h, rows, cols)]
        if budget is not None:
            monkeypatch.setattr(matrix_mod, "CACHE_ELEMENTS", budget)
            monkeypatch.setattr(matrix_mod, "CHUNK_ELEMENTS", budget)
        if gpu_like:
            _no_host_reads(monkeypatch, matrix_mod, pointer_mod)
        got = [scorer.rows(a, h, rows), scorer.rows(a, h, rows, cols)]
    for g, w in zip(got, want):
        assert torch.equal(torch.isinf(g), torch.isinf(w))
        scale = w[torch.isfinite(w)].abs().max()
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6 * float(scale))


@pytest.mark.parametrize("name, options", [("conditional_pointer", {}), ("matrix", {}),
                                           ("matrix", {"inference": "exact"}),
                                           ("matrix", {"direction": "both", "training": "exact"})])
def test_vcp_and_map_forwards_need_no_host_read_on_a_gpu(tokenizer, feats, monkeypatch, name, options):
    """VCP's and MaP's forwards, losses and decoding take no `nonzero` (a host read that makes the GPU
    wait) when the tensors are on a GPU (`reads_wait`), and give what they give on a CPU."""
    from posbias.qa.heads import pointer as pointer_mod

    model = head_model(tokenizer, name, options).double()
    batch, targets = batch_of(feats)

    def run():
        torch.manual_seed(0)  # the same dropout masks
        model.train()
        loss = model(batch, targets)["loss"]
        model.eval()
        with torch.no_grad():
            scores = model(batch)
            spans = model.head.top_spans(scores, batch["span_mask"], batch["span_mask"], 10, 5) \
                if hasattr(model.head, "top_spans") else (scores["start_logits"], scores["end_logits"])
        return loss, spans

    want = run()
    _no_host_reads(monkeypatch, matrix_mod, pointer_mod)
    got = run()
    torch.testing.assert_close(got[0], want[0], rtol=1e-9, atol=0)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


def test_sampled_block_holds_the_gold_pair_exactly_once():
    torch.manual_seed(2)
    scores = torch.randn(3, 10)
    ok = torch.ones(3, 10, dtype=torch.bool)
    ok[2, 5:] = False  # a short row: fewer candidates than k - 1
    gold = torch.tensor([0, int(scores[1].argmax()), 3])  # row 1: the gold is the best score
    idx, valid = _top_but_gold(scores, ok, gold, k=6)
    assert idx.shape == (3, 6)
    for r in range(3):
        assert (idx[r] == gold[r]).sum() == 1 and idx[r, -1] == gold[r]
        picked = idx[r][valid[r]].tolist()
        assert len(set(picked)) == len(picked)  # no entry twice among the valid ones
        others = scores[r].masked_fill(~ok[r], float("-inf"))
        others[gold[r]] = float("-inf")
        assert set(picked[:-1]) == set(others.topk(min(5, int(ok[r].sum()) - (1 if ok[r, gold[r]] else 0))).indices.tolist())
    assert valid[2].sum() == 5  # 4 other candidates + the gold one
    # And in a head's block: the (gold start, gold end) pair occurs once among the k x k pairs.
    head = MatrixHead(8, k=4, width=5)
    h = torch.randn(2, 12, 8)
    batch = {"span_mask": torch.ones(2, 12, dtype=torch.bool), "cls_index": torch.zeros(2, dtype=torch.long),
             "question_mask": torch.zeros(2, 12, dtype=torch.bool), "attention_mask": torch.ones(2, 12)}
    d = head(h, batch)["forward"]
    gs, ge = torch.tensor([3, 7]), torch.tensor([5, 7])
    rows, _ = _top_but_gold(d["first"], batch["span_mask"], gs, 4)
    z = head.dir("forward").pairs.rows(d["a"], d["hidden"], rows)
    cols, _ = _top_but_gold(z, batch["span_mask"][:, None, :].expand_as(z), ge[:, None].expand(-1, 4), 4)
    pairs = (rows[:, :, None] == gs[:, None, None]) & (cols == ge[:, None, None])
    assert (pairs.sum((1, 2)) == 1).all() and pairs[:, -1, -1].all()


@pytest.mark.parametrize("normalization", ["row", "block"])
def test_sampled_loss_equals_exact_loss_when_k_covers_the_sequence(tokenizer, feats, normalization):
    batch, targets = batch_of(feats, 4)
    s = batch["input_ids"].shape[1]
    losses = {}
    for training in ("exact", "sampled"):
        model = head_model(tokenizer, "matrix", {"direction": "both", "training": training, "k": s,
                                                 "normalization": normalization}, seed=4).double()
        losses[training] = model(batch, targets)["loss"]
    torch.testing.assert_close(losses["sampled"], losses["exact"], rtol=1e-10, atol=0)
    small = head_model(tokenizer, "matrix", {"direction": "both", "training": "sampled", "k": 5,
                                             "normalization": normalization}, seed=4).double()
    assert not torch.isclose(small(batch, targets)["loss"], losses["exact"])  # k < s samples a sub-block


def test_row_normalization_is_the_gold_rows_eq7_log_probability(tokenizer, feats):
    """`row` (Eq. 12 as written): L_second = -log P_second(gold first, gold second), the row softmax
    of Eq. 7 that inference uses; `block` normalises over every pair and so differs."""
    batch, targets = batch_of(feats, 4)
    gs, ge = targets["start_positions"], targets["end_positions"]
    losses = {}
    for normalization in ("row", "block"):
        model = head_model(tokenizer, "matrix", {"direction": "forward", "training": "exact",
                                                 "normalization": normalization}, seed=5).double()
        out = model(batch, targets)
        losses[normalization] = out["loss"]
    d, mask = out["forward"], out["mask"]
    with torch.no_grad():
        logp = model.head.dir("forward").row_log_probs(d, gs[:, None], mask)[:, 0]  # (b, s)
    l_first = torch.nn.functional.cross_entropy(d["first"], gs)
    l_second = -logp[torch.arange(len(gs)), ge].mean()
    torch.testing.assert_close(losses["row"], (l_first + l_second) / 2, rtol=1e-10, atol=0)
    assert losses["block"] > losses["row"]  # more competitors in one softmax: a larger loss
    # Only the gold row gets gradient under `row`: B = V₂H is projected for that row alone.
    model = head_model(tokenizer, "matrix", {"direction": "forward", "normalization": "row", "k": 6},
                       seed=5).double()
    seen = []
    handle = model.head.dir("forward").pairs.row.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    model(batch, targets)["loss"].backward()
    handle.remove()
    assert seen and all(shape[1] == 1 for shape in seen)


def test_ensemble_prunes_backward_duplicates_and_keeps_the_best():
    inf = float("-inf")
    fwd = (torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[3, 5, 1]]), torch.tensor([[5, 6, 2]]))
    # (3, 5) is in F with -1.0: B's -0.5 for it is pruned, F's value is kept (§2.6).
    bwd = (torch.tensor([[-0.5, -1.5, inf]]), torch.tensor([[3, 8, -1]]), torch.tensor([[5, 9, -1]]))
    sc, st, en = ensemble_merge(fwd, bwd, 4)
    assert st.tolist() == [[3, 8, 5, 1]] and en.tolist() == [[5, 9, 6, 2]]
    assert sc.tolist() == [[-1.0, -1.5, -2.0, -3.0]]


@pytest.mark.parametrize("direction", ["forward", "backward", "both"])
def test_topk_inference_equals_exact_when_k_covers_all_starts(tokenizer, feats, direction):
    # float64: the two paths chunk the rows differently; no near-tie may flip an order on any CPU.
    model = head_model(tokenizer, "matrix", {"direction": direction}, seed=6).double().eval()
    batch, _ = batch_of(feats)
    s = batch["input_ids"].shape[1]
    with torch.no_grad():
        scores = model(batch)
        results = {}
        for inference, k in (("exact", 20), ("topk", s)):
            model.head.inference, model.head.inference_k = inference, k
            results[inference] = model.head.top_spans(scores, batch["span_mask"], batch["span_mask"], 15, 20)
        model.head.inference, model.head.inference_k = "topk", 2
        few = model.head.top_spans(scores, batch["span_mask"], batch["span_mask"], 15, 20)
    for a, b in zip(results["exact"], results["topk"]):
        torch.testing.assert_close(a, b)
    assert not torch.equal(few[1], results["exact"][1])  # 2 rows cannot hold the 20 best spans
    if direction != "both":  # the exact top spans are those of the exact band
        with torch.no_grad():
            band = model.head.span_scores(scores, 15)
        sc, st, en = top_spans(band, batch["span_mask"], batch["span_mask"], 20)
        torch.testing.assert_close(sc, results["exact"][0].float())  # the generic top-k scores in float32
        assert torch.equal(st, results["exact"][1]) and torch.equal(en, results["exact"][2])


def test_matrix_row_is_a_distribution_over_the_context(tokenizer, feats):
    model = head_model(tokenizer, "matrix", {"direction": "forward"}, seed=7).eval()
    batch, _ = batch_of(feats, 3)
    with torch.no_grad():
        scores = model(batch)
        rows = torch.tensor([[10, 20], [30, 31], [25, 40]])
        logp = model.head.dir("forward").row_log_probs(scores["forward"], rows, scores["mask"])
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(3, 2))
    assert torch.isinf(logp.transpose(1, 2)[~batch["span_mask"]]).all()


@pytest.mark.parametrize("options, message", [
    ({"direction": "sideways"}, "model.head_options.direction"),
    ({"direction": "forward", "ensemble": True}, "model.head_options.ensemble"),
    ({"training": "all"}, "model.head_options.training"),
    ({"inference": "fast"}, "model.head_options.inference"),
    ({"normalization": "joint"}, "model.head_options.normalization"),
    ({"k": 1}, "model.head_options.k"),
    ({"width": 0}, "model.head_options.width"),
    ({"kk": 3}, "model.head_options"),
])
def test_bad_matrix_options_are_config_errors(tokenizer, options, message):
    with pytest.raises(ConfigError, match=message):
        head_model(tokenizer, "matrix", options)


def test_a_trained_matrix_head_decodes_another_way(tokenizer, feats):
    """`set_decoding`: a `both` head switched to ensemble: false decodes exactly as a head built that
    way with the same weights (the forward direction alone), and back; options no decoding reads,
    or an ensemble without both directions, are refused as at construction."""
    batch, _ = batch_of(feats, 6)
    model = head_model(tokenizer, "matrix", {"direction": "both"}, seed=3).eval()
    forward = head_model(tokenizer, "matrix", {"direction": "both", "ensemble": False}, seed=3).eval()
    forward.load_state_dict(model.state_dict())
    with torch.no_grad():
        scores = model(batch)
        ensemble = model.head.top_spans(scores, batch["span_mask"], batch["span_mask"], 10, 5)
        want = forward.head.top_spans(forward(batch), batch["span_mask"], batch["span_mask"], 10, 5)
        model.head.set_decoding(ensemble=False)
        got = model.head.top_spans(scores, batch["span_mask"], batch["span_mask"], 10, 5)
        model.head.set_decoding(ensemble=None)  # the default for `both`
        again = model.head.top_spans(scores, batch["span_mask"], batch["span_mask"], 10, 5)
    assert any(not torch.equal(a, b) for a, b in zip(ensemble, want))  # the two decodings differ here
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    for a, b in zip(again, ensemble):
        torch.testing.assert_close(a, b)
    assert model.head.ensemble is True
    for options, message in (({"k": 3}, "not a decoding option"), ({"ensemble": "yes"}, "true, false or null"),
                             ({"inference_k": 1}, "inference_k")):
        with pytest.raises(ConfigError, match=message):
            model.head.set_decoding(**options)
    with pytest.raises(ConfigError, match="ensemble needs direction: both"):
        head_model(tokenizer, "matrix", {"direction": "forward"}).head.set_decoding(ensemble=True)


def test_ensemble_with_null_answers_is_a_config_error(tokenizer):
    with pytest.raises(ConfigError, match="model.head_options.ensemble"):
        head_model(tokenizer, "matrix", {"direction": "both"}, null_answer=True)


@pytest.mark.parametrize("head", ["conditional_pointer", "matrix"])
def test_null_scores_are_log_probabilities_of_the_cls_span(tokenizer, feats, head):
    model = head_model(tokenizer, head, null_answer=True, seed=8).eval()
    batch, targets = batch_of(feats, 4)
    with torch.no_grad():
        scores = model(batch)
        null = model.head.null_scores(scores, batch["cls_index"])
        sc, st, _ = model.head.top_spans(scores, batch["span_mask"], batch["span_mask"], 15, 5)
    assert null.shape == (4,) and (null < 0).all() and torch.isfinite(null).all()
    assert (st[st >= 0] != 0).all()  # [CLS] is a null answer, never a span start
    loss = model(batch, {k: torch.zeros_like(v) for k, v in targets.items()})["loss"]  # gold = [CLS]
    assert torch.isfinite(loss)


@pytest.mark.parametrize("name", list(HEAD_OPTIONS))
def test_head_trains_saves_reloads_and_evaluates_the_same(tmp_path, name):
    head = name if name in ("conditional_pointer", "dynamic_query") else "matrix"
    cfg = build_config(tiny_config(tmp_path, model={"head": head, "head_options": HEAD_OPTIONS[name]},
                                   train={"max_steps": 3, "eval_every": 3}))
    summary, first, again = train_and_reevaluate(cfg, tmp_path)
    run = tmp_path / "run"
    assert again["f1"] == pytest.approx(first["f1"]) and again["exact_match"] == pytest.approx(first["exact_match"])
    assert summary["steps"] == 3
    # The reloaded model gives the same answers with the same scores (F1 alone is ~0 after 3 steps).
    read = lambda d, f: json.loads((d / f).read_text(encoding="utf-8"))  # noqa: E731
    preds = read(tmp_path / "ev", "predictions.json")
    assert preds == read(run / "eval", "predictions.json") and len(preds) == 24 and all(preds.values())
    nb1, nb2 = read(run / "eval", "nbest.json"), read(tmp_path / "ev", "nbest.json")
    for qid in preds:
        assert [c["text"] for c in nb1[qid]] == [c["text"] for c in nb2[qid]]
        np.testing.assert_allclose([c["score"] for c in nb1[qid]], [c["score"] for c in nb2[qid]], rtol=1e-5)


@pytest.mark.parametrize("null_answer", [False, True])
def test_every_registered_head_follows_the_span_head_protocol(null_answer):
    """Each built-in head has the protocol's members (`SpanHead`), and the optional methods it has
    take the protocol's arguments."""
    import inspect

    from posbias.qa.heads import OPTIONAL_METHODS, SpanHead
    from posbias.qa.model import make_head
    from posbias.registry import HEADS

    arguments = {"top_spans": ["scores", "start_ok", "end_ok", "max_answer_len", "k"],
                 "encode": ["encoder", "inputs", "batch"], "encoder_position_ids": ["inputs", "batch"]}
    assert set(arguments) == set(OPTIONAL_METHODS)
    seen = set()
    for name in HEADS.names():
        head = make_head(name, 32, null_answer, {}, embedding_size=32)
        assert isinstance(head, SpanHead), name
        assert head.null_answer is null_answer, name
        for method in OPTIONAL_METHODS:
            if hasattr(head, method):
                seen.add(method)
                assert list(inspect.signature(getattr(head, method)).parameters) == arguments[method], (name, method)
    assert seen == set(OPTIONAL_METHODS)  # each optional method is used by some built-in head
