"""DyReF (`dynamic_query`): query placement and positions, the attention masks read off the attention
probabilities (eager) and off the outputs (sdpa), query pooling, gradients, Random Padding bounds."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from posbias.config import build_config
from posbias.errors import ConfigError
from posbias.perturb.position_shift import random_padding, random_position_perturbation
from posbias.qa.collate import collate
from posbias.qa.features import build_qa_features
from posbias.qa.heads.dynamic_query import DynamicQueryHead, query_attention_mask
from posbias.qa.model import build_model

from helpers import TINY_ENCODER, tiny_config

MASKS = ("full", "bidirectional", "causal", "independent")


def dyref(tokenizer, options=None, encoder=None, attn="eager", seed=0, null_answer=False):
    torch.manual_seed(seed)
    cfg = build_config(tiny_config(model={"head": "dynamic_query", "head_options": options or {},
                                          "encoder": {**TINY_ENCODER, **(encoder or {})}}))
    model = build_model(cfg.model, tokenizer, null_answer=null_answer)
    model.encoder.set_attn_implementation(attn)
    return model.eval()


@pytest.fixture(scope="module")
def feats(tokenizer, dev_examples):
    return build_qa_features(dev_examples[:8], tokenizer, max_seq_len=96, stride=32, max_query_len=24,
                             train=True, version=1)


def batch_of(feats, n=4):
    return collate(feats, np.arange(n), pad_id=0, with_labels=True)


def test_queries_are_prepended_with_positions_0_and_1(tokenizer, feats):
    model = dyref(tokenizer)
    batch = batch_of(feats)
    kw = model.head.encoder_kwargs(model.encoder, model._inputs, batch)
    b, s = batch["input_ids"].shape
    assert kw["inputs_embeds"].shape == (b, s + 2, 32)
    torch.testing.assert_close(kw["inputs_embeds"][:, :2], model.head.queries.expand(b, 2, 32))
    torch.testing.assert_close(kw["inputs_embeds"][:, 2:], model.encoder.get_input_embeddings()(batch["input_ids"]))
    pos, real = kw["position_ids"], batch["attention_mask"].bool()
    assert (pos[:, :2] == torch.tensor([0, 1])).all()
    assert (pos[:, 2:][real] == (real.long().cumsum(1) - 1 + 2)[real]).all()  # every token moved by 2
    assert (pos[:, 2:][~real] == 0).all()  # padding keeps the pad position
    assert (kw["token_type_ids"][:, :2] == 0).all() and torch.equal(kw["token_type_ids"][:, 2:], batch["token_type_ids"])
    assert torch.equal(kw["attention_mask"], torch.cat([torch.ones(b, 2, dtype=torch.long), batch["attention_mask"]], 1))
    kw = dyref(tokenizer, {"attention": "causal"}).head.encoder_kwargs(model.encoder, model._inputs, batch)
    assert kw["attention_mask"].shape == (b, 1, s + 2, s + 2) and kw["attention_mask"].dtype == torch.float32


def test_roberta_style_positions_count_from_padding_idx(tokenizer, feats):
    """RoBERTa numbers positions from padding_idx + 1: the queries take the first two of those."""
    model = dyref(tokenizer, encoder={"model_type": "roberta", "pad_token_id": 1})
    batch = batch_of(feats, 2)
    pos = model.head.encoder_kwargs(model.encoder, model._inputs, batch)["position_ids"]
    assert (pos[:, :2] == torch.tensor([2, 3])).all() and (pos[:, 2:][batch["attention_mask"].bool()] >= 4).all()


@pytest.mark.parametrize("kind", MASKS)
def test_each_mask_blocks_exactly_the_intended_pairs_in_the_attention_probabilities(tokenizer, feats, kind):
    model = dyref(tokenizer, {"attention": kind}, attn="eager")
    batch = batch_of(feats, 3)
    kw = model.head.encoder_kwargs(model.encoder, model._inputs, batch)
    with torch.no_grad():
        att = torch.stack(model.encoder(**kw, output_attentions=True).attentions)  # (L, b, heads, S, S)
    seen = att.amax(dim=(0, 2)) > 0  # (b, S, S): row attends to column in some layer and head
    real = torch.cat([torch.ones(3, 2, dtype=torch.bool), batch["attention_mask"].bool()], 1)  # (b, S)
    rows = real[:, :, None] & real[:, None, :]  # real rows to real columns
    expect = rows.clone()
    if kind != "full":
        expect[:, 2:, :2] = False
    if kind in ("causal", "independent"):
        expect[:, 0, 1] = False
    if kind == "independent":
        expect[:, 1, 0] = False
    assert torch.equal(seen & rows, expect), f"{kind}: {(seen & rows ^ expect).nonzero()[:5].tolist()}"
    assert (att[..., ~real[0]][:, 0] == 0).all()  # nobody attends to padding (row 0 of the batch)
    # A blocked pair gets exactly zero probability (the additive mask is applied, not ignored).
    if kind != "full":
        assert (att[:, :, :, 2:, :2] == 0).all()


def test_a_boolean_mask_would_not_be_applied_by_eager_attention(tokenizer, feats):
    """Why the head builds additive masks: the same mask as booleans leaks attention (eager)."""
    model = dyref(tokenizer, {"attention": "bidirectional"}, attn="eager")
    batch = batch_of(feats, 2)
    kw = model.head.encoder_kwargs(model.encoder, model._inputs, batch)
    kw["attention_mask"] = kw["attention_mask"] == 0  # True = may attend
    with torch.no_grad():
        att = torch.stack(model.encoder(**kw, output_attentions=True).attentions)
    assert att[:, :, :, 2:, :2].amin() > 1e-4  # every blocked pair leaks (random weights: about 1/S)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", MASKS)
def test_masks_act_on_the_outputs_with_both_attention_implementations(tokenizer, feats, kind, attn):
    """Move one query and see who notices: tokens notice only with `full`; the start query notices
    the end query only with `full` and `bidirectional`; the end query notices the start query unless
    `independent`."""
    model = dyref(tokenizer, {"attention": kind, "query_pooling": "last"}, attn=attn, seed=3)
    batch = batch_of(feats, 2)
    with torch.no_grad():
        ref = model.encode(batch)
        moved = {}
        for q in (0, 1):
            saved = model.head.queries.data.clone()
            model.head.queries.data[q] += torch.randn(32, generator=torch.Generator().manual_seed(q))  # not a
            # constant shift: the embeddings' LayerNorm would remove that
            moved[q] = model.encode(batch)
            model.head.queries.data.copy_(saved)
    real = batch["attention_mask"].bool()
    changed = lambda a, b: not torch.allclose(a, b, atol=1e-6)  # noqa: E731
    assert changed(moved[0]["tokens"][real], ref["tokens"][real]) == (kind == "full")
    assert changed(moved[1]["queries"][:, 0], ref["queries"][:, 0]) == (kind in ("full", "bidirectional"))
    assert changed(moved[0]["queries"][:, 1], ref["queries"][:, 1]) == (kind != "independent")


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_full_attention_as_a_plain_mask_equals_the_explicit_4d_mask(tokenizer, feats, attn):
    """`full` passes the (b, S) padding mask; the explicit additive 4-D mask gives the same states."""
    model = dyref(tokenizer, {"attention": "full", "query_pooling": "max"}, attn=attn, seed=5)
    batch = batch_of(feats, 3)
    kw = model.head.encoder_kwargs(model.encoder, model._inputs, batch)
    assert kw["attention_mask"].dim() == 2
    with torch.no_grad():
        plain = model.encoder(**kw)
        kw["attention_mask"] = query_attention_mask(batch["attention_mask"], "full", torch.float32)
        explicit = model.encoder(**kw)
    real = torch.cat([torch.ones(3, 2, dtype=torch.bool), batch["attention_mask"].bool()], 1)
    for a, b in zip(plain.hidden_states, explicit.hidden_states):
        torch.testing.assert_close(a[real], b[real], rtol=1e-5, atol=1e-5)


def test_eager_and_sdpa_agree(tokenizer, feats):
    batch = batch_of(feats, 3)
    with torch.no_grad():
        a = dyref(tokenizer, {"attention": "causal"}, attn="eager", seed=4)(batch)["start_logits"]
        b = dyref(tokenizer, {"attention": "causal"}, attn="sdpa", seed=4)(batch)["start_logits"]
    ok = batch["span_mask"]
    torch.testing.assert_close(a[ok], b[ok], rtol=1e-4, atol=1e-5)


def test_query_pooling_on_a_constructed_case():
    """last / mean / max over the layers' outputs at the query slots; the embedding output is excluded."""
    hidden = [torch.full((1, 5, 3), 100.0)]  # the embedding layer: must never be used
    hidden += [torch.tensor([[[1.0, 5, -1], [2, 0, 0], [9, 9, 9], [9, 9, 9], [9, 9, 9]]]),
               torch.tensor([[[3.0, 1, -3], [4, 6, 0], [7, 7, 7], [7, 7, 7], [7, 7, 7]]])]

    class Fake(torch.nn.Module):
        def get_input_embeddings(self):
            return torch.nn.Embedding(10, 3)

        def forward(self, **kw):
            return SimpleNamespace(hidden_states=tuple(hidden), last_hidden_state=hidden[-1])

    batch = {"input_ids": torch.zeros(1, 3, dtype=torch.long), "attention_mask": torch.ones(1, 3)}
    inputs = SimpleNamespace(positions=False, types=False, base=0, pad=0)
    expect = {"last": [[3.0, 1, -3], [4, 6, 0]], "mean": [[2.0, 3, -2], [3, 3, 0]], "max": [[3.0, 5, -1], [4, 6, 0]]}
    for pooling, q in expect.items():
        out = DynamicQueryHead(3, query_pooling=pooling).encode(Fake(), inputs, batch)
        assert out["queries"][0].tolist() == q, pooling
        assert torch.equal(out["tokens"], hidden[-1][:, 2:])


@pytest.mark.parametrize("pooling", ["last", "mean", "max"])
def test_queries_receive_gradient(tokenizer, feats, pooling):
    model = dyref(tokenizer, {"query_pooling": pooling}, attn="sdpa").train()
    batch = batch_of(feats)
    targets = {k: batch.pop(k) for k in ("start_positions", "end_positions")}
    model(batch, targets)["loss"].backward()
    g = model.head.queries.grad
    assert g is not None and (g.abs().sum(-1) > 0).all()
    assert sum(p.numel() for p in model.head.parameters()) == 2 * 32  # no parameters but the two queries


@pytest.mark.parametrize("softmax_over", ["all", "context"])
def test_start_logits_are_query_token_dot_products(tokenizer, feats, softmax_over):
    """Eq. 1's scores q_sᵀh_i on the tokens the softmax runs over; the dtype minimum elsewhere."""
    model = dyref(tokenizer, {"query_pooling": "max", "softmax_over": softmax_over})
    batch = collate(feats, np.array([int(np.argmin(feats.lengths)), 0]), pad_id=0, with_labels=True)  # padded
    with torch.no_grad():
        enc = model.encode(batch)
        out = model.head(enc, batch)
    ok = batch["attention_mask"].bool() if softmax_over == "all" else batch["span_mask"]
    assert (~batch["attention_mask"].bool()).any() and (batch["attention_mask"].bool() & ~batch["span_mask"]).any()
    expect = torch.einsum("bsd,bd->bs", enc["tokens"], enc["queries"][:, 0])
    torch.testing.assert_close(out["start_logits"][ok], expect[ok])
    assert (out["start_logits"][~ok] == torch.finfo(torch.float32).min).all()


def test_position_table_must_hold_two_more_positions(tmp_path):
    import posbias

    cfg = build_config(tiny_config(tmp_path, model={"head": "dynamic_query",
                                                    "encoder": {**TINY_ENCODER, "max_position_embeddings": 129}}))
    with pytest.raises(ConfigError, match=r"data.max_seq_len \(128\).*2 positions of model.head 'dynamic_query'"):
        posbias.train(cfg, progress=False)


def test_random_padding_and_rpp_never_exceed_the_position_table(tokenizer, feats):
    n_pos = 96 + 2  # exactly data.max_seq_len + the two queries
    model = dyref(tokenizer, encoder={"max_position_embeddings": n_pos})
    cfg = build_config(tiny_config(data={"max_seq_len": 96, "stride": 32, "max_query_len": 24}))
    batch = batch_of(feats, 8)
    gen = torch.Generator().manual_seed(0)
    for make in (random_padding, random_position_perturbation):
        shift = make(max_seq_len=cfg.data.max_seq_len)
        shift.bind(model)
        assert shift.max_len + 2 <= n_pos
        for _ in range(50):
            shifted = shift(batch, gen)
            pos = model.head.encoder_kwargs(model.encoder, model._inputs, shifted)["position_ids"]
            assert pos.max() < n_pos and (pos[:, :2] == torch.tensor([0, 1])).all()
        with torch.no_grad():
            model(shifted)  # runs without an index error
    too_long = random_padding(max_len=97, max_seq_len=cfg.data.max_seq_len)
    with pytest.raises(ConfigError, match="2 head positions"):
        too_long.bind(model)


def test_query_attention_mask_values():
    m = query_attention_mask(torch.tensor([[1, 1, 0]]), "causal", torch.float32)[0, 0]
    neg = torch.finfo(torch.bfloat16).min  # precision.mask_min: finite when autocast casts it to bf16
    assert m.shape == (5, 5) and (m[:, 4] == neg).all()  # padding column
    assert m[0, 1] == neg and m[1, 0] == 0 and (m[2:, :2] == neg).all() and (m[2:4, 2:4] == 0).all()


def test_bad_options_and_export_are_clear_errors(tokenizer, tmp_path):
    with pytest.raises(ConfigError, match="model.head_options.query_pooling"):
        dyref(tokenizer, {"query_pooling": "sum"})
    with pytest.raises(ConfigError, match="model.head_options.attention"):
        dyref(tokenizer, {"attention": "none"})
    from posbias.checkpoint import save_checkpoint
    from posbias.qa.model import export_hf

    model = dyref(tokenizer)
    cfg = build_config(tiny_config(tmp_path, model={"head": "dynamic_query"}))
    save_checkpoint(model, cfg, tokenizer, tmp_path / "ck")
    with pytest.raises(ConfigError, match="dynamic_query.*no Hugging Face equivalent"):
        export_hf(tmp_path / "ck", tmp_path / "hf")


def test_explain_attention_writes_the_map(tmp_path):
    """A briefly trained DyReF model: the 2 x (2 + N) map of max attention, its PNG and JSON, and the
    CLI; a model without queries is refused in one line."""
    import json

    import posbias
    from helpers import cli_here

    cfg = build_config(tiny_config(tmp_path, model={"head": "dynamic_query"}, train={"max_steps": 2}))
    posbias.train(cfg, progress=False)
    ctx = "The book is on the desk in the small room."
    res = posbias.explain_attention(tmp_path / "run" / "best", "Where is the book?", ctx, tmp_path / "ex",
                                    answer="on the desk")
    att = np.array(res["attention"])
    n = len(res["tokens"])
    assert att.shape == (2, n) and res["tokens"][:2] == ["[q_s]", "[q_e]"] and "[CLS]" in res["tokens"][2]
    assert (att > 0).all() and (att <= 1).all()  # full attention: every query sees every position
    assert [res["tokens"][i] for i in res["gold_tokens"]] == ["on", "the", "des", "##k"]  # the tiny vocabulary
    assert res["answer"] in ctx and res["predicted_tokens"]
    assert [res["tokens"][i] for i in res["context_tokens"]][:3] == ["the", "book", "is"]  # the context only
    assert res["context_tokens"][-1] == n - 2  # ... up to the final [SEP]
    from posbias.checkpoint import load_checkpoint
    from posbias.qa.explain import example_attention

    model, tok, mcfg = load_checkpoint(tmp_path / "run" / "best", task="qa")
    model.eval()
    ctx2 = "The pen is on the desk and the book is on the desk too."
    first = example_attention(model, tok, mcfg, "Where is the book?", ctx2, "on the desk")
    second = example_attention(model, tok, mcfg, "Where is the book?", ctx2, "on the desk",
                               answer_start=ctx2.rindex("on the desk"))
    assert first["gold_tokens"][0] < second["gold_tokens"][0]  # the gold span at the given offset
    with pytest.raises(ConfigError, match="does not occur in the context at character 1"):
        example_attention(model, tok, mcfg, "Where is the book?", ctx2, "on the desk", answer_start=1)
    png = (tmp_path / "ex" / "attention.png").read_bytes()
    assert png[:4] == b"\x89PNG" and json.loads((tmp_path / "ex" / "attention.json").read_text())["tokens"] == res["tokens"]
    r = cli_here("explain", "attention", "--model", str(tmp_path / "run" / "best"), "--question", "Where?",
                 "--context", ctx, "--output-dir", str(tmp_path / "ex2"))
    assert r.returncode == 0 and (tmp_path / "ex2" / "attention.png").is_file(), r.stderr[-2000:]
    plain = build_config(tiny_config(tmp_path / "plain", train={"max_steps": 1}))
    posbias.train(plain, progress=False)
    r = cli_here("explain", "attention", "--model", str(tmp_path / "plain" / "run" / "best"), "--question", "Where?",
                 "--context", ctx, "--output-dir", str(tmp_path / "ex3"))
    assert r.returncode != 0 and "needs a dynamic_query" in r.stderr and "Traceback" not in r.stderr


# Encoders whose input embeddings are narrower than their hidden states (16 vs 32 here), as in
# ELECTRA-small (128 vs 256) and ALBERT (128 vs 768+).
NARROW_EMBEDDINGS = {"electra": {**TINY_ENCODER, "model_type": "electra", "embedding_size": 16},
                     "albert": {**TINY_ENCODER, "model_type": "albert", "embedding_size": 16}}


@pytest.mark.parametrize("kind", list(NARROW_EMBEDDINGS))
def test_queries_take_the_embedding_width_of_electra_and_albert(tokenizer, feats, kind):
    """The queries enter beside the word embeddings (Eq. 3's h_i^0), so they are as wide as those;
    the encoder's own projection lifts queries and tokens to the hidden size. (They were hidden-sized:
    `RuntimeError: Sizes of tensors must match`.)"""
    model = dyref(tokenizer, encoder=NARROW_EMBEDDINGS[kind], attn="eager")
    assert model.encoder.get_input_embeddings().embedding_dim == 16 and model.encoder.config.hidden_size == 32
    assert model.head.queries.shape == (2, 16)
    batch = batch_of(feats, 2)
    kw = model.head.encoder_kwargs(model.encoder, model._inputs, batch)
    assert kw["inputs_embeds"].shape[-1] == 16
    targets = {k: batch.pop(k) for k in ("start_positions", "end_positions")}
    enc = model.train().encode(batch)
    assert enc["queries"].shape[-1] == enc["tokens"].shape[-1] == 32
    model.head(enc, batch, targets)["loss"].backward()
    assert (model.head.queries.grad.abs().sum(-1) > 0).all()


@pytest.mark.parametrize("kind", list(NARROW_EMBEDDINGS))
def test_dyref_on_electra_and_albert_trains_saves_reloads_and_evaluates(tmp_path, kind):
    import json

    from helpers import train_and_reevaluate

    cfg = build_config(tiny_config(tmp_path, model={"head": "dynamic_query", "encoder": NARROW_EMBEDDINGS[kind]},
                                   train={"max_steps": 3, "eval_every": 3}))
    summary, first, again = train_and_reevaluate(cfg, tmp_path)
    run = tmp_path / "run"
    assert summary["steps"] == 3 and again["f1"] == pytest.approx(first["f1"])
    read = lambda d: json.loads((d / "predictions.json").read_text(encoding="utf-8"))  # noqa: E731
    assert read(tmp_path / "ev") == read(run / "eval") and len(read(run / "eval")) == 24


def test_position_updates_count_the_ids_the_encoder_looks_up(tokenizer, feats):
    """The update counter sees what DyReF's encoder gets: ids 0 and 1 for the queries and every
    token's id moved by 2, also when Random Padding shifts them (it counted the tokens' own ids)."""
    from posbias.analysis.updates import PositionUpdateCounter

    model = dyref(tokenizer)
    looked_up = []
    hook = model.encoder.embeddings.position_embeddings.register_forward_hook(
        lambda module, args, out: looked_up.append(args[0]))
    short = int(np.argmin(feats.lengths))
    batch = collate(feats, np.array([short, 0]), pad_id=0, with_labels=True)  # the first row padded
    alone = collate(feats, np.array([short]), pad_id=0, with_labels=True)
    cfg = build_config(tiny_config(data={"max_seq_len": 96, "stride": 32, "max_query_len": 24}))
    shift = random_padding(max_seq_len=cfg.data.max_seq_len)
    shift.bind(model)
    shifted = shift(alone, torch.Generator().manual_seed(0))
    moved = int(shifted["position_shift"][0])
    assert moved > 0
    counted = []
    for b in (batch, alone, shifted):
        counter = PositionUpdateCounter(model.encoder.config.max_position_embeddings)
        counter.add_model_batch(model, b)
        counter.end_step()
        with torch.no_grad():
            model(b)
        ids, real = model.encoder_position_ids(b)
        assert torch.equal(ids, looked_up.pop())  # the very ids the position table is indexed with
        n = len(b["input_ids"])
        assert torch.equal(real, torch.cat([torch.ones(n, 2, dtype=torch.bool), b["attention_mask"].bool()], 1))
        expect = np.zeros_like(counter.counts)
        expect[ids[real].unique().numpy()] = 1
        assert counter.counts.tolist() == expect.tolist()
        counted.append(np.flatnonzero(counter.counts).tolist())
    longest, m = int(batch["attention_mask"].sum(1).max()), int(feats.lengths[short])
    assert counted[0] == list(range(longest + 2))  # queries 0, 1; tokens 2 .. longest + 1
    assert counted[1] == list(range(m + 2))
    # Random Padding: [CLS] keeps its id (2 after the queries), the rest moves by the shift.
    assert counted[2] == [0, 1, 2] + list(range(3 + moved, m + 2 + moved))
    hook.remove()
    # Without queries nothing moves: the tokens' ids, 0 .. longest - 1.
    plain = build_model(build_config(tiny_config()).model, tokenizer, null_answer=False)
    counter = PositionUpdateCounter(512)
    counter.add_model_batch(plain, batch)
    counter.end_step()
    assert np.flatnonzero(counter.counts).tolist() == list(range(longest))
