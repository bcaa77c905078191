"""Ms-PoE (posbias/generation/mspoe.py) on tiny random decoders built from configs: unit ratios give
the model back, the rotation matches a hand computation at p / r, padding and caching change nothing,
and the model is restored on exit."""
from __future__ import annotations

import contextlib

import pytest
import torch
import transformers as tf

from posbias.errors import ConfigError
from posbias.generation.mspoe import MsPoEHandle, assign_ratios, head_ratios, ms_poe, outlier_scores

VOCAB = 100
SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
         "max_position_embeddings": 128, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1}


def tiny(family: str, *, layers: int = 4, impl: str = "eager", init: float = 0.3, seed: int = 0):
    """A random causal LM of `family`, 4 query heads over 1-2 key/value heads; `init` (the weights'
    std) is large enough that attention is peaked, so positions and the head order matter."""
    torch.manual_seed(seed)
    kw = dict(SMALL, num_hidden_layers=layers, initializer_range=init, attn_implementation=impl)
    if family == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**kw, num_key_value_heads=2)).eval()
    if family == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(**kw, num_key_value_heads=2, sliding_window=4)).eval()
    if family == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**kw, num_key_value_heads=2)).eval()
    if family == "qwen3":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**kw, num_key_value_heads=1, head_dim=16)).eval()
    if family == "gemma":
        return tf.GemmaForCausalLM(tf.GemmaConfig(**kw, num_key_value_heads=1, head_dim=16)).eval()
    if family == "gemma2":
        return tf.Gemma2ForCausalLM(tf.Gemma2Config(**kw, num_key_value_heads=1, head_dim=16, sliding_window=4,
                                                    query_pre_attn_scalar=16, attn_logit_softcapping=5.0)).eval()
    if family == "gemma3":  # sliding layers (window 4, local rope_theta) mixed with full ones, like Gemma 3 270M
        types = ["sliding_attention", "full_attention"] * (layers // 2) + ["sliding_attention"] * (layers % 2)
        return tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**kw, num_key_value_heads=1, head_dim=16, sliding_window=4,
                                                        layer_types=types, query_pre_attn_scalar=16)).eval()
    raise ValueError(family)


def batch(lengths=(11, 7), seed: int = 1):
    """(input_ids, attention_mask): rows of the given lengths, padded on the left."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(3, VOCAB, (n,), generator=g)
        mask[i, width - n:] = 1
    return ids, mask


def assert_close(actual, expected, rel: float = 1e-5):
    """Equal up to `rel` times the reference's largest magnitude (float32-safe on any CPU)."""
    scale = expected.abs().max().item()
    assert (actual - expected).abs().max().item() <= rel * scale, (actual - expected).abs().max().item() / scale


@torch.no_grad()
def logits(model, ids, mask=None, **kw):
    return model(input_ids=ids, attention_mask=mask, use_cache=False, **kw).logits


# ---- ratios and head order -------------------------------------------------------------------------


def test_head_ratios_are_evenly_spaced_from_min_towards_max():
    assert torch.allclose(head_ratios(4), torch.tensor([1.2, 1.35, 1.5, 1.65]))
    assert torch.allclose(head_ratios(32)[[0, -1]], torch.tensor([1.2, 1.78125]))  # the authors' 32 heads
    assert torch.equal(head_ratios(3, 1.0, 1.0), torch.ones(3))
    assert head_ratios(1).tolist() == pytest.approx([1.2])


@pytest.mark.parametrize("lo, hi", [(0.5, 1.8), (1.8, 1.2), (float("nan"), 1.8), (1.2, float("inf")), ("1.2", 1.8),
                                    (0, 1)])
def test_bad_ratios_are_refused_in_one_line(lo, hi):
    with pytest.raises(ConfigError) as e:
        head_ratios(4, lo, hi)
    assert "\n" not in str(e.value) and "ratio" in str(e.value)
    with pytest.raises(ConfigError), ms_poe(tiny("llama"), min_ratio=lo, max_ratio=hi):
        pass


def test_outlier_scores_count_weights_above_three_times_the_visible_mean():
    # one row, 4 heads, 8 keys of which the first 2 are padding: the threshold is 3 / 6 = 0.5
    w = torch.zeros(1, 4, 8)
    w[0, 0, 2:] = torch.tensor([0.55, 0.45, 0.0, 0.0, 0.0, 0.0])  # 1 outlier
    w[0, 1, 2:] = 1 / 6  # uniform: none
    w[0, 2, 2:] = torch.tensor([0.6, 0.0, 0.0, 0.0, 0.0, 0.0])
    w[0, 2, 0] = 0.9  # a weight on a padding key is not counted
    w[0, 3, 2:] = torch.tensor([0.0, 0.0, 0.51, 0.0, 0.0, 0.49])
    visible = torch.tensor([[False, False, True, True, True, True, True, True]])
    scores = outlier_scores(w, visible)
    assert scores[0].tolist() == pytest.approx([1 / 6, 0.0, 1 / 6, 1 / 6])
    w[0, 3, 7] = 0.51  # head 3 now has two outliers: the most position-aware
    ratios = assign_ratios(outlier_scores(w, visible), head_ratios(4))
    # rank 0 (head 3) gets the smallest ratio; heads 0 and 2 tie and keep index order; head 1 is last
    assert ratios[0].tolist() == pytest.approx([1.35, 1.65, 1.5, 1.2])


# ---- refusals ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, name", [
    (lambda: tf.BertModel(tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64)), "bert"),
    (lambda: tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4)), "gpt2"),
])
def test_unsupported_model_is_refused_in_one_line(make, name):
    with pytest.raises(ConfigError) as e, ms_poe(make()):
        pass
    assert f"model type {name!r}" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kw", [{"layers": [4]}, {"layers": [2, 2]}, {"layers": []}, {"layers": [True]},
                                {"order": "random"}])
def test_bad_layers_or_order_are_refused(kw):
    with pytest.raises(ConfigError) as e, ms_poe(tiny("llama"), **kw):
        pass
    assert "\n" not in str(e.value)


def test_default_layers_skip_the_first_two():
    with ms_poe(tiny("llama", layers=4)) as h:
        assert h.layers == (2, 3)
    with pytest.raises(ConfigError, match="first 2"), ms_poe(tiny("llama", layers=2)):
        pass


# ---- equivalence with the unmodified model ---------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gemma3", "mistral", "qwen2", "qwen3", "gemma", "gemma2"])
@pytest.mark.parametrize("padded", [False, True])
def test_unit_ratios_give_the_unmodified_model(family, padded):
    # float64 without padding; with padding float32, because HF's eager softmax casts the float64
    # mask minimum to -inf and a fully masked padding row turns NaN in the original model itself
    # eager both sides: transformers' eager softmax runs in float32 even for a float64 model, so a
    # float64 sdpa reference differs by float32 rounding (the sdpa switch: the restoration test)
    model = tiny(family)
    ids, mask = batch((11, 7)) if padded else batch((11, 11))
    if not padded:
        model, mask = model.double(), None
    expected = logits(model, ids, mask)
    with ms_poe(model, min_ratio=1.0, max_ratio=1.0, layers=range(4)):
        actual = logits(model, ids, mask)
    keep = slice(None) if mask is None else mask.bool()
    assert_close(actual[keep], expected[keep], 1e-10 if not padded else 1e-5)


# ---- the rotation itself ----------------------------------------------------------------------------------


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE by hand: pair dim j with dim j + d/2 as a complex number, turn it by position * theta^(-2j/d)."""
    d = x.shape[-1]
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angle = positions.double()[:, None] * freq  # (s, d/2)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat([z.real, z.imag], dim=-1)


def hand_attention(attn, x, positions, ratios, theta, window, scaling):
    """(output, (b, h, s, s) weights) of one attention layer, head h at positions p / ratios[h]."""
    b, s, _ = x.shape
    d = attn.head_dim
    q = attn.q_proj(x).view(b, s, -1, d)  # (b, s, h, d)
    k = attn.k_proj(x).view(b, s, -1, d)  # (b, s, g, d)
    v = attn.v_proj(x).view(b, s, -1, d)
    if getattr(attn, "q_norm", None) is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    n_heads, group = q.shape[2], q.shape[2] // k.shape[2]
    i = torch.arange(s)
    allowed = i[None, :] <= i[:, None]
    if window is not None:
        allowed &= i[:, None] - i[None, :] < window
    outs, weights = [], []
    for h in range(n_heads):
        pos = positions / float(ratios[h])
        qh, kh = rotate(q[:, :, h], pos, theta), rotate(k[:, :, h // group], pos, theta)
        w = torch.softmax((qh @ kh.transpose(1, 2) * scaling).masked_fill(~allowed, float("-inf")), dim=-1)
        outs.append(w @ v[:, :, h // group])
        weights.append(w)
    return attn.o_proj(torch.cat(outs, dim=-1)), torch.stack(weights, dim=1)


@pytest.mark.parametrize("family, layer", [("gemma3", 0), ("gemma3", 1), ("llama", 1)])
def test_each_head_attends_at_positions_divided_by_its_ratio(family, layer):
    model = tiny(family).double()
    cfg = model.config
    attn = model.model.layers[layer].self_attn
    ids, _ = batch((12,))
    positions = torch.arange(12) + 5  # not the slot indices: the model's position ids are what is scaled
    seen = {}
    attn.register_forward_pre_hook(lambda m, a, kw: seen.update(x=kw["hidden_states"]), with_kwargs=True)
    attn.register_forward_hook(lambda m, a, out: seen.update(out=out[0], w=out[1]))
    with torch.no_grad(), ms_poe(model, min_ratio=1.0, max_ratio=3.0, layers=[layer], order="index"):
        model(input_ids=ids, position_ids=positions[None], use_cache=False)
        ratios = head_ratios(4, 1.0, 3.0)  # 1, 1.5, 2, 2.5: head i gets ratio i under order="index"
        if family == "gemma3":
            layer_type = cfg.layer_types[layer]
            theta, scaling = cfg.rope_parameters[layer_type]["rope_theta"], cfg.query_pre_attn_scalar ** -0.5
            window = cfg.sliding_window if layer_type == "sliding_attention" else None
        else:
            theta, scaling, window = cfg.rope_parameters["rope_theta"], attn.head_dim ** -0.5, None
        out, w = hand_attention(attn, seen["x"], positions, ratios, theta, window, scaling)
    # inv_freq and positions are float32 in the model, as in transformers: 1e-5 of the magnitude
    assert_close(seen["w"], w)
    assert_close(seen["out"], out)


# ---- effect, restoration, padding, the cache ----------------------------------------------------------------


def test_ratios_change_the_logits_and_the_model_is_restored_after_the_block():
    model = tiny("gemma3", impl="sdpa")
    ids, mask = batch()
    expected = logits(model, ids, mask)
    attns = [layer.self_attn for layer in model.model.layers]
    with ms_poe(model, layers=[1, 2, 3]) as h:
        assert isinstance(h, MsPoEHandle) and model.config._attn_implementation == "eager"
        changed = logits(model, ids, mask)
    with ms_poe(model, min_ratio=1.0, max_ratio=1.0, layers=[1, 2, 3]):  # eager with unit ratios = sdpa
        assert_close(logits(model, ids, mask)[mask.bool()], expected[mask.bool()])
    assert (changed - expected)[mask.bool()].abs().max() > 1e-3 * expected.abs().max()
    assert torch.equal(logits(model, ids, mask), expected)
    assert model.config._attn_implementation == "sdpa"
    assert all("forward" not in a.__dict__ and a.forward.__func__ is type(a).forward for a in attns)
    with pytest.raises(RuntimeError, match="boom"), ms_poe(model, layers=[1, 2, 3]):
        raise RuntimeError("boom")
    assert all("forward" not in a.__dict__ for a in attns) and model.config._attn_implementation == "sdpa"
    assert torch.equal(logits(model, ids, mask), expected)


@pytest.mark.parametrize("family", ["gemma3", "llama"])
def test_left_padding_changes_no_row(family):
    # the head order is per row, its threshold counts only visible keys: a padded row scores as if alone
    model = tiny(family)
    ids, mask = batch((11, 6))
    with ms_poe(model, layers=[1, 2, 3]) as h:
        together = logits(model, ids, mask)
        ratios = dict(h.ratios)  # layer -> (2, h)
        for row, n in enumerate((11, 6)):
            alone = logits(model, ids[row:row + 1, -n:])
            assert_close(together[row, -n:], alone[0])
            assert all(torch.equal(ratios[i][row], h.ratios[i][0]) for i in h.layers)
    # the rows were ordered differently somewhere: the test is not vacuous
    assert any(not torch.equal(ratios[i][0], ratios[i][1]) for i in h.layers)


def test_query_index_orders_heads_as_the_prompt_alone():
    # scoring prompt + answer in one forward orders the heads at the prompt's last token when asked
    model = tiny("gemma3").double()
    ids, _ = batch((14,))
    prompt = ids[:, :10]
    with ms_poe(model, layers=[1, 2, 3]) as h:
        on_prompt = logits(model, prompt)
        wanted = dict(h.ratios)
        h.query_index = torch.tensor([9])
        scored = logits(model, ids)
        assert all(torch.equal(h.ratios[i], wanted[i]) for i in h.layers)
        h.query_index = None
        logits(model, ids)
        assert any(not torch.equal(h.ratios[i], wanted[i]) for i in h.layers)  # the answer moved the order
    assert_close(scored[:, :10], on_prompt, 1e-10)


@pytest.mark.parametrize("family", ["gemma3", "llama"])
@pytest.mark.parametrize("order", ["outlier", "index"])
def test_cached_decoding_equals_recomputing_the_whole_sequence(family, order):
    # a cached step keeps the prefill's head order; a full forward gets the same order from the
    # prompt's last token (query_index), so the two must agree. The sequence grows past Gemma 3's
    # sliding window (4): its sliding cache drops keys on the way. The model is float64, but the
    # rotary cos and sin are float32 (as the model computes them), and a one-token step and the whole
    # sequence take different vectorised paths through them on some CPUs (AVX2 only: up to 4e-7 of
    # the logits' scale, against 2e-2 and more when the full forward orders heads from another token): 1e-6
    model = tiny(family).double()
    ids, _ = batch((7,))
    with torch.no_grad(), ms_poe(model, layers=[1, 2, 3], order=order) as h:
        h.query_index = torch.tensor([6])
        out = model(input_ids=ids, use_cache=True)
        seq = ids
        for _ in range(5):
            nxt = out.logits[:, -1:].argmax(-1)
            seq = torch.cat([seq, nxt], dim=1)
            out = model(input_ids=nxt, cache=out.cache, use_cache=True)
            assert_close(out.logits[:, -1], logits(model, seq)[:, -1], 1e-6)


def test_generate_keeps_the_prefill_order_and_each_row_as_if_alone():
    model = tiny("gemma3")
    ids, mask = batch((9, 5))
    kw = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0, "return_dict_in_generate": True,
          "output_scores": True}
    with torch.no_grad(), ms_poe(model, layers=[1, 2, 3]) as h:
        logits(model, ids[1:, -5:])
        wanted = h.ratios[3]
        alone = model.generate(input_ids=ids[1:, -5:], **kw)
        assert torch.equal(h.ratios[3], wanted)  # decode steps reuse the prefill's order
        together = model.generate(input_ids=ids, attention_mask=mask, **kw)
    assert torch.equal(together.sequences[1, -6:], alone.sequences[0, -6:])
    assert_close(torch.stack(together.scores)[:, 1], torch.stack(alone.scores)[:, 0])


# Layers and head orders (`resolve_layers`, `order="reversed"`)


def test_the_default_layers_are_the_global_ones_of_a_hybrid_model_and_the_authors_of_a_full_one():
    from posbias.generation.mspoe import layer_kinds, resolve_layers

    hybrid = tiny("gemma3", layers=6)  # sliding, full, sliding, full, sliding, full
    assert layer_kinds(hybrid) == ["sliding_attention", "full_attention"] * 3
    assert resolve_layers(hybrid, "auto") == resolve_layers(hybrid, "global") == [3, 5]
    assert resolve_layers(hybrid, "all") == [2, 3, 4, 5] and resolve_layers(hybrid, None) == [3, 5]
    full = tiny("llama", layers=5)
    assert layer_kinds(full) == ["full_attention"] * 5
    assert resolve_layers(full, "auto") == resolve_layers(full, "all") == [2, 3, 4]
    assert resolve_layers(full, [0, 4]) == [0, 4]
    with pytest.raises(ConfigError, match="no global-attention layer after the first 2"):
        resolve_layers(tiny("gemma3", layers=3), "global")  # sliding, full, sliding: layer 1 only
    with pytest.raises(ConfigError, match="layers must be one of auto, all, global"):
        resolve_layers(full, "every")
    with ms_poe(hybrid) as h:
        assert h.layers == (3, 5)


def test_the_reversed_order_gives_head_i_the_ratio_of_head_n_minus_one_minus_i():
    model = tiny("llama")
    ids, mask = batch()
    ratios = head_ratios(4, 1.2, 1.8)
    with torch.no_grad(), ms_poe(model, layers=[2], order="reversed") as h:
        model(input_ids=ids, attention_mask=mask)
        assert torch.equal(h.ratios[2], ratios.flip(0).expand(ids.shape[0], -1))
    with torch.no_grad(), ms_poe(model, layers=[2], order="index") as h:
        model(input_ids=ids, attention_mask=mask)
        assert torch.equal(h.ratios[2], ratios.expand(ids.shape[0], -1))


def _eager(model):
    """The unmodified model computed in eager attention (what `ms_poe` computes in), for a `with` block."""
    from posbias.generation.mspoe import _configs, _decoder

    @contextlib.contextmanager
    def block():
        cfgs = [(c, getattr(c, "_attn_implementation_internal", None)) for c in _configs(model, _decoder(model))]
        try:
            for c, _ in cfgs:
                c._attn_implementation_internal = "eager"
            yield
        finally:
            for c, impl in cfgs:
                c._attn_implementation_internal = impl

    return block()


@pytest.mark.integration
def test_unit_ratios_give_the_real_gemma_back(gemma_cache):
    """Gemma 3 270M, two 4-document prompts of the bundled SQuAD dev slice (714 and 800 tokens, past the
    512-token sliding window of its local layers): Ms-PoE at ratio 1 on the layers the diagnosis patches
    (global, the default) and on the authors' layers equals the unmodified model to the bit in fp32 (both in eager attention), and the diagnosis's sdpa scores within 1e-4 nats per token.
    In bf16 it stays within 0.1 nats of the fp32 scores on a 200-token prompt (measured 0.016, where bf16
    sdpa moves the same score by 0.012): a check of bf16's precision through the patch, not of the ratios
    (the fp32 checks are), on a short prompt because bf16 without native instructions (AVX2-only CPUs)
    is slow (5 s for these 200 tokens, 13 s for 400)."""
    import dataclasses

    import numpy as np

    from helpers import DEMO_DEV
    from posbias.generation import benchmark as B
    from posbias.generation.lm import load_lm
    from posbias.generation.scoring import answer_logprobs
    from posbias.qa.readers import read_dataset

    def scores(lm, enc, context=None):
        with torch.inference_mode(), (context or contextlib.nullcontext()) as handle:
            before = None
            if handle is not None and hasattr(handle, "query_index"):
                before = lambda cols: setattr(handle, "query_index", cols)  # noqa: E731
            return answer_logprobs(lm.model, enc, pad_id=lm.tokenizer.pad_token_id, device=lm.device, batch_size=2,
                                   before=before)

    ds = read_dataset(str(DEMO_DEV))
    lm = load_lm("gemma", device="cpu", precision="fp32", cache_dir=gemma_cache)
    mset = B.multi_document_qa(ds.examples, lm.count_tokens, k=4, max_doc_tokens=4000, seed=0,
                               question_ids=[e.id for e in ds.examples[:2]])
    enc = lm.encode([B.prompt(q.question, q.documents(3)) for q in mset.questions],
                    [q.answers[0] for q in mset.questions], chat=False)
    assert len(enc) == 2 and min(len(e.prompt) for e in enc) > 512
    sdpa = scores(lm, enc)
    eager = scores(lm, enc, _eager(lm.model))
    for layers in ("auto", "all"):
        unit = scores(lm, enc, ms_poe(lm.model, min_ratio=1.0, max_ratio=1.0, layers=layers))
        assert np.array_equal(unit, eager), (layers, np.abs(unit - eager).max())
        assert np.abs(unit - sdpa).max() < 1e-4
    moved = scores(lm, enc, ms_poe(lm.model, layers="auto"))
    assert np.abs(moved - sdpa).max() > 1e-3  # the real ratios do change the scores
    short = [dataclasses.replace(enc[0], prompt=enc[0].prompt[:1] + enc[0].prompt[-200:])]  # BOS + the last 200
    bf16 = load_lm("gemma", device="cpu", precision="bf16", cache_dir=gemma_cache)
    unit16 = scores(bf16, short, ms_poe(bf16.model, min_ratio=1.0, max_ratio=1.0))
    assert np.abs(unit16 - scores(lm, short)).max() < 0.1
